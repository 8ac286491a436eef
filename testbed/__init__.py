"""What a run is made of around the algorithm: the embedded task and the real benchmarks with their answer checks
(arith, tasks, data, verifiers), the policies (policies, tiny, token_bytes, sequences, lora, costs) and what a run
keeps (checkpoint, metrics_log)."""
