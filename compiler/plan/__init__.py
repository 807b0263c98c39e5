"""The plan layer: what a plan holds and the facts about it that passes and runtime share."""
