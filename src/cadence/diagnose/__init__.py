"""`cadence diagnose`: explain prefill/decode interference in a recording and recommend
scheduler settings (recording -> analysis -> replay in the simulator -> report and plots)."""
