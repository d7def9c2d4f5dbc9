"""EdgeAcc: intra-GPU prefill/decode disaggregation mechanisms (torch and the standard library only).

* ``tensor_share``: export/import named tensors (weights, KV pool, req_to_token) between the
  decode side (owner) and the prefill side (importer) with zero copies; CUDA IPC on GPUs,
  shared-memory files on the CPU.
* ``ordering``: explicit cross-process GPU ordering (interprocess CUDA events in a ring, or a
  host synchronisation), no-ops on the CPU.
* ``sm_partition``: the environment each side is spawned with for its SM share (MPS thread
  percentage or a green-context percentage) and the green-context stream helper.

None of these modules imports sglang, so they run from the repository with ``PYTHONPATH=python``.
"""
