"""Text in and out for a real target: its tokenizer, its chat template, its EOS ids.

The verifier encodes a text prompt with the *target's* tokenizer (the id map HELLO
compared with the drafter's) and decodes the generated ids for the answer. The toy has
no tokenizer: a verifier serving it has no ``TextCodec`` and refuses text prompts.
"""

from __future__ import annotations

from collections.abc import Sequence


class TextCodec:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        ids = eos if isinstance(eos, list) else [eos]
        self.eos_ids = frozenset(int(i) for i in ids if i is not None)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Prompt ids; ``chat``: the prompt as one user message in the chat template,
        followed by the assistant's turn opener (what a chat model expects)."""
        if chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True,
                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return [int(t) for t in self.tokenizer(prompt)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
