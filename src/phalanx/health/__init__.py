"""A gang's health: progress, stragglers, bad numbers, and bad nodes (the doctor)."""
