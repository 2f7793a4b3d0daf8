"""Query what embedstream wrote to Milvus from an application of your own (pymilvus and
sentence-transformers; nothing of embedstream's is imported).

What an application needs to know:

- **Where**: the alias (``EMBEDSTREAM_MILVUS_ALIAS``, default ``embeddings``), never a collection
  name: ``embedstream migrate`` moves the alias to a new model's collection in one call.
- **What**: one row per chunk; the dense vector in the field ``vector``, COSINE metric; ``doc_id``,
  ``chunk_index``, ``span_start``/``span_end``, ``excerpt`` and ``metadata`` (a JSON map of strings).
- **How the query is embedded**: with the same model, its **query prompt** before the text (the
  documents were embedded with its document prompt; MiniLM has neither, e5 has ``query: `` and
  ``passage: ``), and normalised.
- **Chunks by document**: a long document is several rows; ask for more rows than documents and keep
  each document's best chunk.
- **Filters with values from users**: never paste user text into an expression. On a Milvus server
  (2.5 and later) pass values as ``filter_params`` (the expression names them, ``{lang}``). Where the
  server does not take templates (milvus-lite), quote each value with :func:`literal`, which writes it
  as a string literal that reads back as exactly the value.

    python examples/readers/query.py --uri http://localhost:19530 --model /models/minilm "reset a password" --lang en
"""

from __future__ import annotations

import argparse
import json

#: Characters a Milvus string literal cannot hold as they are, and how they are written.
_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def literal(value: str) -> str:
    """``value`` as a double-quoted Milvus string literal (for servers without filter templates)."""
    return '"' + value.translate(_ESCAPES) + '"'


def search(client, model, text: str, *, alias: str = "embeddings", query_prompt: str = "", top_k: int = 5,
           lang: str | None = None, templates: bool = True) -> list[dict]:
    """The ``top_k`` best documents for ``text``, each with its best chunk: ``[{doc_id, score, chunk_index,
    span, excerpt, metadata}]``. ``lang``: only documents whose ``metadata["lang"]`` is that value
    (a parameter: ``templates`` on a server that takes them, else quoted by :func:`literal`)."""
    vector = model.encode([query_prompt + text], normalize_embeddings=True)[0].tolist()
    where: dict = {}
    if lang is not None:
        where = ({"filter": 'metadata["lang"] == {lang}', "filter_params": {"lang": lang}} if templates
                 else {"filter": f'metadata["lang"] == {literal(lang)}'})
    rows = client.search(alias, data=[vector], anns_field="vector", limit=top_k * 4,
                         search_params={"metric_type": "COSINE"},
                         output_fields=["doc_id", "chunk_index", "span_start", "span_end", "excerpt", "metadata"],
                         **where)[0]
    best: dict[str, dict] = {}
    for hit in rows:  # nearest first: a document's first row is its best chunk
        e = hit["entity"]
        if e["doc_id"] not in best:
            best[e["doc_id"]] = {"doc_id": e["doc_id"], "score": hit["distance"], "chunk_index": e["chunk_index"],
                                 "span": [e["span_start"], e["span_end"]], "excerpt": e["excerpt"],
                                 "metadata": e["metadata"]}
    return list(best.values())[:top_k]


def main() -> None:
    from pymilvus import MilvusClient
    from sentence_transformers import SentenceTransformer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("text")
    ap.add_argument("--uri", default="http://localhost:19530")
    ap.add_argument("--token", default=None)
    ap.add_argument("--alias", default="embeddings")
    ap.add_argument("--model", required=True, help="the model the workers run (EMBEDSTREAM_MODEL)")
    ap.add_argument("--query-prompt", default="", help="its query prompt (e.g. 'query: ' for e5)")
    ap.add_argument("--lang", default=None, help="only documents with this metadata lang")
    ap.add_argument("--no-templates", action="store_true", help="quote filter values (milvus-lite)")
    ap.add_argument("-k", "--top-k", type=int, default=5)
    args = ap.parse_args()
    client = MilvusClient(args.uri, token=args.token or "")
    hits = search(client, SentenceTransformer(args.model), args.text, alias=args.alias,
                  query_prompt=args.query_prompt, top_k=args.top_k, lang=args.lang, templates=not args.no_templates)
    for hit in hits:
        print(json.dumps(hit, ensure_ascii=False))


if __name__ == "__main__":
    main()
