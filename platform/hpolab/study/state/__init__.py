"""What the study's trials are, as the stores record it: the trial budget and its states, who owns a
trial (owner records), retry copies, closing runs a killed driver left open, riding out storage
outages. Imports no other study sub-package."""
