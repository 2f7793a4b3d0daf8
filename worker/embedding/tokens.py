"""The tokenizer side of one sentence-transformers model: token ids, the character spans the chunk
step cuts at, prompt lengths, and the padded arrays of a forward pass (as numpy: the model side puts
them on its device).

Hugging Face fast tokenizers keep their truncation and padding settings as shared state that each
call sets again, so one :class:`Tokens` is used from one thread at a time: the prepare thread
tokenizes (``worker.embedding.sentence.TextSide``); the embed thread only calls :meth:`Tokens.pad`,
which reads no tokenizer state.
"""

from __future__ import annotations

import numpy as np

from worker.process import metrics


class Tokens:
    """A model's tokenizer, for texts of at most ``max_seq_length`` tokens. ``keep_whole``: remember
    the ids of the texts :meth:`offsets_over` finds to fit whole, for :meth:`ids` (not with a document
    prompt: prompt and text are then tokenized together)."""

    def __init__(self, tokenizer, max_seq_length: int, keep_whole: bool = True) -> None:
        self._tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.keep_whole = keep_whole
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self.pad_left = getattr(tokenizer, "padding_side", "right") == "left"
        #: Whether the model takes ``token_type_ids`` (BERT does).
        self.token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        #: Special tokens added to every text (BERT's [CLS] and [SEP]).
        self.special_tokens = int(tokenizer.num_special_tokens_to_add(pair=False))
        self._prompt_lengths: dict[str, int] = {}
        #: Token ids of whole texts that ``offsets_over`` tokenized last (``ids`` reuses them).
        self.known_ids: dict[str, list[int]] = {}
        self._real_tokens = metrics.MODEL_TOKENS.labels("real")
        self._padded_tokens = metrics.MODEL_TOKENS.labels("padded")

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added, truncated to the model's max), unpadded."""
        return self._tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.max_seq_length,
                               return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def with_prompt(self, texts: list[str], prompt: str) -> list[list[int]]:
        """Token ids of each text with ``prompt`` before it (tokenized together), else :meth:`ids`."""
        return self.tokenize([prompt + t for t in texts]) if prompt else self.ids(texts)

    def length(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (a document prompt's cost in a chunk)."""
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def ids(self, texts: list[str]) -> list[list[int]]:
        """``tokenize(texts)``, taking the ids :meth:`offsets_over` kept where it has them."""
        known = self.known_ids
        if not known:
            return self.tokenize(texts)
        found = [known.get(t) for t in texts]
        todo = [i for i, seq in enumerate(found) if seq is None]
        fresh = dict(zip(todo, self.tokenize([texts[i] for i in todo]))) if todo else {}
        return [seq if seq is not None else fresh[i] for i, seq in enumerate(found)]

    def _encodings(self, texts: list[str]) -> list | None:
        """The Rust backend's encodings of ``texts`` (no special tokens, nothing truncated); None for
        a slow tokenizer, which has no offsets. The backend's truncation and padding settings are
        shared state that each ``tokenize`` call sets again, so they are cleared here."""
        backend = getattr(self._tokenizer, "_tokenizer", None)
        if backend is None:
            return None
        backend.no_truncation()
        backend.no_padding()
        return backend.encode_batch(texts, add_special_tokens=False)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]] | None:
        """Character spans of each text's tokens (no special tokens, nothing truncated); None for a
        slow tokenizer (the caller cuts between words)."""
        encodings = self._encodings(texts)
        return None if encodings is None else [list(enc.offsets) for enc in encodings]

    def offsets_over(self, texts: list[str], limit: int) -> list[list[tuple[int, int]] | None] | None:
        """As :meth:`worker.embedding.base.Embedder.offsets_over`, tokenizing each text once (None
        for a slow tokenizer). With ``keep_whole``, the ids of a text that fits the model whole are
        kept for :meth:`ids` (until the next call here), so the chunk step's long texts that stay one
        chunk are not tokenized a second time: the same ids the model's own tokenizing would give
        (the text is whole, nothing is truncated), so the same vectors."""
        encodings = self._encodings(texts)
        if encodings is None:
            return None
        backend = self._tokenizer._tokenizer
        out: list[list[tuple[int, int]] | None] = []
        known: dict[str, list[int]] = {}
        for text, enc in zip(texts, encodings):
            if len(enc.ids) > limit:
                out.append(list(enc.offsets))
                continue
            out.append(None)
            if self.keep_whole:
                ids = backend.post_process(enc).ids  # the special tokens added, as tokenize() adds them
                if len(ids) <= self.max_seq_length:
                    known[text] = ids
        self.known_ids = known
        return out

    def prompt_length(self, prompt: str) -> int:
        """The prompt's tokens as the pooling counts them: with the leading special token, without a
        trailing one (what sentence-transformers hands a pooling that leaves the prompt out)."""
        if prompt not in self._prompt_lengths:
            ids = self._tokenizer([prompt], add_special_tokens=True)["input_ids"][0]
            trailing = ids and ids[-1] in set(self._tokenizer.all_special_ids)
            self._prompt_lengths[prompt] = len(ids) - (1 if trailing else 0)
        return self._prompt_lengths[prompt]

    def pad(self, ids: list[list[int]]) -> dict[str, np.ndarray]:
        """The inputs of one forward pass: ``ids`` padded to the longest, the attention mask, and
        zero token types where the model takes them (what the tokenizer's own padding makes, without
        tokenizing again). Counts the real and padded tokens."""
        longest = max(len(seq) for seq in ids)
        input_ids = np.full((len(ids), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, seq in enumerate(ids):
            cols = slice(longest - len(seq), longest) if self.pad_left else slice(0, len(seq))
            input_ids[row, cols] = seq
            mask[row, cols] = 1
        self._real_tokens.inc(int(mask.sum()))
        self._padded_tokens.inc(mask.size)
        out = {"input_ids": input_ids, "attention_mask": mask}
        if self.token_types:
            out["token_type_ids"] = np.zeros_like(input_ids)
        return out
