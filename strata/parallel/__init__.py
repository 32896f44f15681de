"""Tensor parallelism: one model split over N ranks (torch.distributed; NCCL on GPUs, gloo on CPUs).

- `group`: this rank's place (`TensorParallel`), joining the group, the collectives the layers call.
- `shard`: which GGUF tensors split how, and one rank's part cut from the stored bytes.
- `plan`: the start check that every split divides, before any process starts.
- `launch`: rank 0 starts N-1 follower processes and joins them (`start_tensor_parallel`).
- `leader`: rank 0 announces each model step to the followers and owns their processes.
- `follower`: a follower's main loop: load its part, run each announced step until Stop.
- `messages`: the step and stop messages.
"""
