"""Text in and out for a real target: its tokenizer, its chat template, its EOS ids.

The verifier encodes a text prompt with the *target's* tokenizer (the id map HELLO
compared with the drafter's) and decodes the generated ids for the answer; the OpenAI
chat route renders its messages with ``apply_chat_template``. The toy has
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
            return self.apply_chat_template([{"role": "user", "content": prompt}])
        return [int(t) for t in self.tokenizer(prompt)["input_ids"]]

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of ``messages`` ({"role", "content"} each, in order) in the tokenizer's
        chat template, then the assistant's turn opener: the OpenAI chat route's prompt.
        Only for a tokenizer with a template (``has_chat_template``; callers refuse
        otherwise). A template that refuses the messages (some raise on an unexpected
        role order) gives ValueError, the caller's 4xx, never a server error."""
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True)
        except TemplateError as e:
            raise ValueError(f"the chat template refused these messages: {e}") from None
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)
