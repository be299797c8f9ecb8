"""Layer 9, the report: a sweep's files -> rliable statistics, figures, an HTML page and a W&B report run
(``python -m rlexp.report <sweep dir>``)."""
