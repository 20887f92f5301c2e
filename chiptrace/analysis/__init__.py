"""Analysis: utilization, critical path and bottleneck rules over the span tables."""
