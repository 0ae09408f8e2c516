"""`hpolab compare`: a study's trials as one table, or runs side by side (command, study table, the SQL
fast path, runs, rendering). May import the layers below analysis (errors, config, stores, study,
registry); nothing else in analysis imports it except report (which reuses its table and renderers)."""
