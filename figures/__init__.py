"""figures: one script per figure; each reads a results folder and never runs an experiment."""
