"""Offline RL agents TF-Agents lacks, as `TFAgent`s with CORL's settings."""
