"""Where a long text is cut into chunks the model can take whole.

A text is split on its own tokens (the model's tokenizer gives each token's character offsets) into
windows of at most ``max_tokens`` tokens that overlap by ``overlap`` tokens. A window ends at a
sentence end where one lies in its last quarter, else at a word boundary there, else where the
budget runs out; the next window starts ``overlap`` tokens back, at the start of a word. Each chunk
is a character span of the original text, so a reader can show what matched. A text that fits is
one chunk spanning all of it: the model sees exactly the text it saw before chunking existed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from worker.core.records import Chunk, DeadLetter, Item, Share, content_hash
from worker.embedding.base import Embedder
from worker.process import metrics

#: Characters that end a sentence when whitespace follows them.
SENTENCE_END = frozenset(".!?。！？")

#: Chunk plans of long texts remembered by content hash: a repeated long text (a re-sent document,
#: or one the cache serves) is not tokenized again to find its chunks. At most this many plans, and
#: at most ``PLAN_MEMO_CHUNKS`` chunks in all (~150 bytes a chunk: ~10 MB), whatever the texts; a
#: plan of more than ``max_chunks`` chunks (its record is dead-lettered) is not kept.
PLAN_MEMO_SIZE = 4096
PLAN_MEMO_CHUNKS = 65_536


def _starts_word(offsets: list[tuple[int, int]], i: int) -> bool:
    """Token ``i`` begins a new word: whitespace (or nothing) lies between it and the token before."""
    return i == 0 or offsets[i][0] > offsets[i - 1][1]


def _cut(text: str, offsets: list[tuple[int, int]], start: int, limit: int, max_tokens: int) -> int:
    """The exclusive end (token index) of the window that starts at ``start`` and may reach ``limit``."""
    floor = start + max(1, (3 * max_tokens) // 4)
    for end in range(limit, floor - 1, -1):  # a sentence end, latest first
        last = offsets[end - 1]
        if last[1] > last[0] and text[last[1] - 1] in SENTENCE_END and _starts_word(offsets, end):
            return end
    for end in range(limit, floor - 1, -1):  # else a word boundary
        if _starts_word(offsets, end):
            return end
    return limit


def plan_chunks(text: str, offsets: list[tuple[int, int]], max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the chunks of ``text``, given the character offsets of its
    tokens (special tokens left out). ``[(0, len(text))]`` when the tokens fit in ``max_tokens``.

    Every token lies in at least one chunk; consecutive chunks share about ``overlap`` tokens
    (fewer where the start moves forward to a word start); each chunk holds at most ``max_tokens``."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    n = len(offsets)
    if n <= max_tokens:
        return [(0, len(text))]
    overlap = max(0, min(overlap, max_tokens // 2))
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        limit = min(start + max_tokens, n)
        end = limit if limit == n else _cut(text, offsets, start, limit, max_tokens)
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == n:
            return spans
        nxt = max(end - overlap, start + 1)
        while nxt < end and not _starts_word(offsets, nxt):
            nxt += 1
        start = nxt


def _whole(it: Item) -> Chunk:
    """The one chunk of a text the model takes whole: the text itself, under the document's hash."""
    return Chunk(0, 0, len(it.text), it.text, it.hash)


class Chunker:
    """``process(group)`` fills ``item.chunks`` for every item of a group of batches, on the prepare
    thread (the only thread that uses a model's tokenizer: ``worker.embedding.tokens``).

    A text no longer in characters than a chunk's token budget fits whatever the tokenizer does
    (a token covers at least one character) and becomes one chunk without tokenizing: the short
    texts of most workloads pay nothing. Longer ones go to the model together in one call
    (``Embedder.offsets_over``), which answers with token offsets only for those that do not fit. With
    ``mode="off"`` every text stays one chunk and the model truncates it, as before chunking, but
    what was cut is counted. A text that would yield more than ``max_chunks`` chunks becomes a
    dead letter (``too_many_chunks``) in its batch, written whole to the DLQ instead of half to
    Milvus."""

    def __init__(self, embedder: Embedder, mode: str, max_tokens: int, overlap: int, max_chunks: int,
                 dead_lettered: Callable[[str, str], None] = lambda reason, message: None) -> None:
        self.embedder = embedder
        #: Told of each dead letter made here (``DlqLimit.record_late``: the breaker counts it).
        self.dead_lettered = dead_lettered
        self.mode = mode
        self.max_tokens = max_tokens
        self.overlap = overlap
        self.max_chunks = max_chunks
        #: content hash → (spans, chunk hashes) of long texts, least recently used dropped first.
        self._plans: OrderedDict[str, tuple[list[tuple[int, int]], list[str]]] = OrderedDict()
        self._plan_chunks = 0  # chunks in ``_plans``

    @property
    def safe_chars(self) -> float:
        """No text of at most this many characters yields more than ``max_chunks`` chunks (a longer
        one's record is kept, to be dead-lettered whole if it does; infinite with chunking off). Each
        chunk but the last advances at least three quarters of the budget less the overlap, and a
        token is at least one character."""
        if self.mode != "tokens":
            return float("inf")
        step = max(1, (3 * self.max_tokens) // 4 - min(self.overlap, self.max_tokens // 2))
        return self.max_tokens + step * (self.max_chunks - 1)

    def _remember(self, h: str, plan: tuple[list[tuple[int, int]], list[str]]) -> None:
        """Keep ``plan`` of the text hashed ``h``; drop the least recently used past either bound."""
        plans = self._plans
        plans[h] = plan
        self._plan_chunks += len(plan[0])
        while len(plans) > PLAN_MEMO_SIZE or self._plan_chunks > PLAN_MEMO_CHUNKS:
            _, (spans, _) = plans.popitem(last=False)
            self._plan_chunks -= len(spans)

    def spans(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """The chunk spans of each text: ``[(0, len(text))]`` for a text no longer in characters than
        the budget (never tokenized); the others tokenized together in one call and planned."""
        out = [[(0, len(t))] for t in texts]
        long = [i for i, t in enumerate(texts) if len(t) > self.max_tokens]
        if long:
            for i, offsets in zip(long, self.embedder.offsets_over([texts[i] for i in long], self.max_tokens)):
                if offsets is not None:
                    out[i] = plan_chunks(texts[i], offsets, self.max_tokens, self.overlap)
        return out

    def process(self, share: Share) -> None:
        """Cut each item of the model's ``share`` into chunks (``Item.chunks``); an item that would
        make too many is put in its place as a dead letter, and leaves the share."""
        items = share.places
        if self.mode == "off":
            self._truncate([it for _, _, it in items])
            return
        # Long texts only (a short one is one chunk without tokenizing); each distinct text once.
        plans, found = self._plans, {}
        for _, _, it in items:
            if len(it.text) > self.max_tokens and it.hash in plans:
                plans.move_to_end(it.hash)
                found[it.hash] = plans[it.hash]
        todo = {it.hash: it.text for _, _, it in items if len(it.text) > self.max_tokens and it.hash not in found}
        for (h, text), spans in zip(todo.items(), self.spans(list(todo.values()))):
            found[h] = (spans, [content_hash(text[a:b]) for a, b in spans] if len(spans) > 1 else [h])
            if len(spans) <= self.max_chunks:
                self._remember(h, found[h])
        counts: list[int] = []  # chunks of each long document, observed at once
        kept: list[tuple[int, int, Item]] = []
        for index, pos, it in items:
            if len(it.text) <= self.max_tokens:
                it.chunks = [_whole(it)]
                kept.append((index, pos, it))
                continue
            spans, hashes = found[it.hash]
            if len(spans) > self.max_chunks:
                dead = share.group[index].entries[pos] = self._too_many(it, len(spans))
                self.dead_lettered(dead.reason, dead.message)
                continue
            kept.append((index, pos, it))
            if len(spans) == 1:
                it.chunks = [_whole(it)]
            else:
                it.chunks = [Chunk(i, a, b, it.text[a:b], h) for i, ((a, b), h) in enumerate(zip(spans, hashes))]
            counts.append(len(it.chunks))
        share.places = kept
        if counts:
            metrics.CHUNKS_PER_DOCUMENT.observe_many(counts)
            metrics.DOCUMENTS_CHUNKED.inc(sum(n > 1 for n in counts))

    def _truncate(self, items: list[Item]) -> None:
        """``mode="off"``: every text one chunk; the tokens the model will cut are counted."""
        for it in items:
            it.chunks = [_whole(it)]
        long = [it.text for it in items if len(it.text) > self.max_tokens]
        for offsets in self.embedder.offsets_over(long, self.max_tokens) if long else []:
            if offsets is not None:
                metrics.DOCUMENTS_TRUNCATED.inc()
                metrics.TOKENS_TRUNCATED.inc(len(offsets) - self.max_tokens)

    def _too_many(self, it: Item, chunks: int) -> DeadLetter:
        key, value, headers = it.original or (it.id.encode(), None, None)
        return DeadLetter(it.source, key, value, headers, "too_many_chunks",
                          f"the text would yield {chunks:,} chunks of {self.max_tokens} tokens, over the limit of "
                          f"{self.max_chunks:,} (EMBEDSTREAM_MAX_CHUNKS)")
