"""EdgeAcc: intra-GPU prefill/decode disaggregation mechanisms (torch and the standard library only).

* ``tensor_share``: how named tensors (weights, KV pool, req_to_token) are shared between the
  decode side (owner) and the prefill side (importer) with zero copies; CUDA IPC on GPUs,
  shared-memory files on the CPU. ``tensor_export`` is the owner's side, ``tensor_import``
  the importer's, ``tensor_bundle`` the picklable bundle between them.
* ``ordering``: explicit cross-process GPU ordering (interprocess CUDA events in a ring, or a
  host synchronisation), no-ops on the CPU.
* ``sm_partition``: the environment each side is spawned with for its SM share (MPS thread
  percentage or a green-context percentage, and MPS client priority), the green-context stream
  helper, and the one definition of the SM modes.

None of these modules imports sglang, so they run from the repository with ``PYTHONPATH=python``.
The MPS control daemon the SM splits need has its own subpackage, :mod:`sglang_edgeacc.mps`.
"""
