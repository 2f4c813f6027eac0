"""Text tokenizers in the official chat layout: bytes (models without a downloaded processor) and the official
processor of a real checkpoint. The embedded model's phoneme front end is :mod:`rvqspec_lib.models.frontend`.
"""

from __future__ import annotations

import torch


class ByteTokenizer:
    """Offline text tokenizer: UTF-8 bytes as ids 0..255 plus the config's special ids.

    Builds the same chat layout as the official ``_build_assistant_text``:
    ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``.
    Used by ``tiny-random`` and the real-size random architectures (which have no processor offline).
    """

    def __init__(self, im_start: int, im_end: int, assistant: int):
        self.im_start, self.im_end, self.assistant = im_start, im_end, assistant
        self.newline = ord("\n")

    def __call__(self, text: str) -> torch.Tensor:
        """Encode one text. Returns ``(1, L)`` int64 ids. Raises ``ValueError`` on empty text."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty: pass the sentence to speak, e.g. --text 'Hello world.'")
        body = list(text.encode("utf-8"))
        ids = [self.im_start, self.assistant, self.newline, *body, self.im_end, self.newline,
               self.im_start, self.assistant, self.newline]
        return torch.tensor([ids], dtype=torch.long)


class ProcessorTokenizer:
    """Wraps the official processor of a real checkpoint (Qwen2 BPE) with the official chat layout."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, text: str) -> torch.Tensor:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty: pass the sentence to speak, e.g. --text 'Hello world.'")
        full = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
        ids = self.processor(text=full, return_tensors="pt", padding=True)["input_ids"]
        return ids if ids.dim() == 2 else ids.unsqueeze(0)
