"""`hpolab report`: one self-contained HTML file about a study (command, data gathering, the SQL fast
path, figures, trial tables, HTML parts). May import analysis.compare and the layers below analysis;
nothing else in analysis imports it."""
