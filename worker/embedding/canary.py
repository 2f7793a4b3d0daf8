"""The canary: a fixed set of texts whose vectors are kept with a collection, so that a worker can
tell when the model it loaded no longer makes the vectors the collection holds.

A model id (``worker.embedding.base.model_identity``) covers the model's files. It does not cover
what runs them: the precision (a broken int8 export), the device, or the libraries (an upgrade that
changes pooling, tokenization or truncation). Vectors of one id can then drift apart silently, and
a collection ends up holding two spaces that search cannot tell apart. The first worker to write a
collection embeds :data:`CANARY_TEXTS` and stores the vectors (:class:`Canary`, kept by
``worker.assembly.canaries``); every later worker embeds them again and compares, text by text:
the smallest cosine must reach the bound of the less exact of the two precisions
(:data:`MIN_COSINE`). Below it, the worker refuses to write, with one line that says the model, the
precisions, the cosine found and what differs between the two (:meth:`Canary.differences`).

What the canary guards: anything that changes these texts' vectors by more than a precision's own
noise. What it does not: a change these texts do not exercise (a script or a length they lack), a
drift smaller than the bound, and a collection written before canaries existed until a worker
stores one (from then on, its vectors are the reference).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from importlib import metadata

import numpy as np

from worker.embedding.base import Embedder

#: Varied lengths and scripts: a word, sentences, code, numbers and symbols, six scripts, and one
#: text longer than a small model's window (its truncation is exercised too).
CANARY_TEXTS: tuple[str, ...] = (
    "embedding",
    "The quick brown fox jumps over the lazy dog.",
    "Kafka topics are split into partitions; each partition is an ordered, immutable log of records.",
    "def upsert(rows):\n    return client.upsert(collection, rows)  # idempotent by primary key",
    "Invoice 2026-11-29: 3 x 19.99 EUR = 59.97 EUR (VAT 19 % incl.) -> ref #A-4471 ✓",
    "Die Straßenbahn fährt über die Brücke, während es draußen schneit.",
    "Мы обновили модель, и векторы должны остаться теми же самыми.",
    "向量数据库根据语义相似度返回最近的文档。",
    "يعيد البحث الدلالي المستندات الأقرب في المعنى إلى السؤال.",
    "検索拡張生成では、質問に近い文書を最初に取り出します。",
    " ".join(f"Section {i}: the worker reads a record, batches it, embeds it, writes the vector to "
             "Milvus and publishes it to the output topic, then commits the input offset." for i in range(12)),
)

#: The smallest cosine, text by text, between two runs of the same model at these precisions: a
#: precision's own noise passes (int8 against float32 measured at cosine 0.98 and over on this model's
#: check set), a different computation does not. Two precisions: the lower bound of the two.
MIN_COSINE: dict[str, float] = {"fp32": 0.999, "fp16": 0.99, "bf16": 0.98, "int8": 0.95}
#: A precision not in :data:`MIN_COSINE` (a new one): judged as the loosest.
LOOSEST = min(MIN_COSINE.values())

#: The libraries whose versions may change what a model computes (those installed are recorded).
LIBRARIES = ("embedstream", "sentence-transformers", "transformers", "tokenizers", "torch", "openvino",
             "onnxruntime", "optimum", "numpy")


def texts_id(texts: tuple[str, ...] = CANARY_TEXTS) -> str:
    """A short hash of the canary texts: vectors of other texts are not compared."""
    return hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:12]


def library_versions() -> dict[str, str]:
    """The installed version of each of :data:`LIBRARIES` (those missing left out), read from the
    packages' metadata: nothing is imported."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def bound(a: str, b: str) -> float:
    """The smallest cosine two runs at precisions ``a`` and ``b`` must reach on every canary text."""
    return min(MIN_COSINE.get(a, LOOSEST), MIN_COSINE.get(b, LOOSEST))


#: The longest canary record read (eleven texts' vectors of a 4,096-dimension model are about 120 KB).
MAX_RECORD_CHARS = 1_000_000


@dataclasses.dataclass(frozen=True)
class Canary:
    """The canary texts' vectors as one worker made them, and what made them."""

    model_id: str
    precision: str
    device: str
    versions: dict[str, str]
    texts: str
    #: One row per canary text, unit length (stored as float16: a cosine's error stays under 1e-3).
    vectors: np.ndarray

    @classmethod
    def of(cls, model: Embedder) -> Canary:
        """Embed the canary texts with ``model`` now."""
        vectors = np.asarray(model.embed(list(CANARY_TEXTS)), dtype=np.float32)
        return cls(model.model_id, model.precision, model.device, library_versions(), texts_id(), vectors)

    def cosines(self, other: Canary) -> np.ndarray:
        """The cosine of each canary text's two vectors."""
        a, b = self.vectors.astype(np.float32), other.vectors.astype(np.float32)
        return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    def comparable(self, other: Canary) -> bool:
        """The same model id, texts and dim: the cosines mean something."""
        return (self.model_id, self.texts, self.vectors.shape) == (other.model_id, other.texts, other.vectors.shape)

    def differences(self, stored: Canary) -> str:
        """What differs between the ``stored`` run and this one: precision, device, library versions."""
        out = [f"{k} {a} → {b}" for k, a, b in (("precision", stored.precision, self.precision),
                                                 ("device", stored.device, self.device)) if a != b]
        for name in sorted(set(stored.versions) | set(self.versions)):
            a, b = stored.versions.get(name, "absent"), self.versions.get(name, "absent")
            if a != b:
                out.append(f"{name} {a} → {b}")
        return ", ".join(out) or "nothing recorded (same precision, device and library versions)"

    def dumps(self) -> str:
        """As the text a collection keeps (JSON, the vectors as base64 float16)."""
        return json.dumps({"model_id": self.model_id, "precision": self.precision, "device": self.device,
                           "versions": self.versions, "texts": self.texts, "shape": list(self.vectors.shape),
                           "vectors": base64.b64encode(self.vectors.astype("<f2").tobytes()).decode("ascii")},
                          sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> Canary:
        """What :meth:`dumps` wrote; ``ValueError`` when it is not that (whatever the text: deep JSON,
        a wrong shape, megabytes)."""
        if not isinstance(text, str) or len(text) > MAX_RECORD_CHARS:
            raise ValueError(f"not a canary record (a {type(text).__name__} of {len(text):,} characters)")
        try:
            d = json.loads(text)
            vectors = np.frombuffer(base64.b64decode(d["vectors"]), dtype="<f2").reshape(d["shape"])
            return cls(str(d["model_id"]), str(d["precision"]), str(d["device"]), dict(d["versions"]),
                       str(d["texts"]), vectors.astype(np.float32))
        except Exception as exc:  # KeyError, TypeError, RecursionError of deep JSON, a reshape's ValueError
            raise ValueError(f"not a canary record ({type(exc).__name__}: {str(exc)[:200]})") from None
