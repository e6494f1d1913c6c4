"""Files: model directories (`checkpoint`)."""
