"""Training: workloads (MLP on digits, a byte-level transformer on text), their data, the
straggler profiles, outer optimisers (LocalSGD, DiLoCo) and update compression."""
