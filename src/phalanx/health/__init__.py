"""A gang's health: progress and ETA, stragglers, anomalies (NaN, spikes), bad nodes (doctor)."""
