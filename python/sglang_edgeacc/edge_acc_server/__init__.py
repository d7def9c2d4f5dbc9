"""EdgeAcc inside sglang: the decode side and the prefill side as sglang schedulers.

Every TP rank of an EdgeAcc launch is two scheduler processes on one GPU:

* the **decode side** is the scheduler upstream launches (TP, DP and DP
  attention launch it exactly as without EdgeAcc). It owns every piece of
  state -- weights, KV pool, ``req_to_token``, allocator, radix cache -- and
  does all scheduling. It runs decode steps itself and hands each prefill batch
  it admits to its prefill side;
* the **prefill side** is spawned by its decode side once the pools exist. It
  imports the weights and pools (CUDA IPC on GPUs, shared memory on the CPU
  platform), runs the prefill forwards it is sent, samples the first token and
  returns it. It never allocates.

The torch-only mechanisms these modules use live in :mod:`sglang_edgeacc.edge_acc`.
"""
