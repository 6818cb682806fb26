"""Stage 6, render: terminal text and JSON from the report document. Only this stage draws."""
