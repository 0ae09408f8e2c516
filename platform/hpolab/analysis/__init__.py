"""Reading a study back: status, compare, the HTML report, and reproduce."""
