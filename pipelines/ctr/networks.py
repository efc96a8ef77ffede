"""CTR models: DIN and DCNv2, with knowledge vectors through a KAR-style mixture-of-experts converter.

Every model scores a :class:`~pipelines.ctr.features.CtrTensors` batch and returns logits ``[B]``.
With ``knowledge_dim=None`` the model has no knowledge inputs at all (the "none" baseline).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pipelines.ctr.features import CtrTensors, ItemCatalog


@dataclass
class ModelConfig:
    """Sizes shared by the CTR models.

    Args:
        embed_dim: size of each id embedding (item, category, genre, rating level) (default: 16).
        converter_dim: output size of the knowledge converter, per entity (default: 32).
        n_experts: experts in the converter (default: 4).
        expert_hidden: hidden width of each expert MLP (default: 128).
        mlp: hidden widths of the deep tower (default: (200, 80), as in the paper).
        cross_layers: DCNv2 cross layers (default: 3).
        dropout: dropout in the deep tower (default: 0.0).
    """

    embed_dim: int = 16
    converter_dim: int = 32
    n_experts: int = 4
    expert_hidden: int = 128
    mlp: tuple[int, ...] = (200, 80)
    cross_layers: int = 3
    dropout: float = 0.0


def mlp(sizes: list[int], dropout: float = 0.0) -> nn.Sequential:
    """Linear + ReLU (+ dropout) for each consecutive pair of ``sizes``."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
    return nn.Sequential(*layers)


class MoEConverter(nn.Module):
    """Mixture-of-experts converter (KAR): ``sum_i softmax(gate(x))_i * expert_i(x)``, dim -> out_dim."""

    def __init__(self, in_dim: int, out_dim: int, n_experts: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim)) for _ in range(n_experts)
        )
        self.gate = nn.Linear(in_dim, n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, in_dim] -> [B, out_dim]
        weights = torch.softmax(self.gate(x), dim=-1)  # [B, E]
        outputs = torch.stack([expert(x) for expert in self.experts], 1)  # [B, E, out_dim]
        return (weights.unsqueeze(-1) * outputs).sum(1)


class ItemEmbedding(nn.Module):
    """Item representation: item id ⊕ category ⊕ mean of genre embeddings, each ``embed_dim`` wide."""

    item_category: torch.Tensor  # buffers (register_buffer), declared for the type checker
    item_genres: torch.Tensor

    def __init__(self, catalog: ItemCatalog, embed_dim: int) -> None:
        super().__init__()
        self.item = nn.Embedding(catalog.n_items, embed_dim, padding_idx=0)
        self.category = nn.Embedding(catalog.n_categories, embed_dim, padding_idx=0)
        self.genre = nn.Embedding(catalog.n_genres, embed_dim, padding_idx=0)
        self.register_buffer("item_category", catalog.category.clone(), persistent=False)
        self.register_buffer("item_genres", catalog.genres.clone(), persistent=False)
        self.dim = 3 * embed_dim

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: [...] -> [..., 3 * embed_dim]
        genres = self.item_genres[idx]  # [..., G]
        count = (genres > 0).sum(-1, keepdim=True).clamp(min=1)
        genre_mean = self.genre(genres).sum(-2) / count
        return torch.cat([self.item(idx), self.category(self.item_category[idx]), genre_mean], -1)


class KnowledgeInput(nn.Module):
    """User and item knowledge vectors through one converter each, zeroed where missing, plus the flags."""

    def __init__(self, knowledge_dim: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.user = MoEConverter(knowledge_dim, cfg.converter_dim, cfg.n_experts, cfg.expert_hidden)
        self.item = MoEConverter(knowledge_dim, cfg.converter_dim, cfg.n_experts, cfg.expert_hidden)
        self.dim = 2 * cfg.converter_dim + 2

    def forward(self, batch: CtrTensors) -> torch.Tensor:  # -> [B, 2 * converter_dim + 2]
        if batch.user_vec is None or batch.item_vec is None or batch.user_has is None or batch.item_has is None:
            raise ValueError("this model was built with knowledge inputs but the batch has no knowledge vectors")
        user = self.user(batch.user_vec) * batch.user_has.unsqueeze(-1)
        item = self.item(batch.item_vec) * batch.item_has.unsqueeze(-1)
        return torch.cat([user, item, batch.user_has.unsqueeze(-1), batch.item_has.unsqueeze(-1)], -1)


class _CtrBase(nn.Module):
    """Shared inputs: item embeddings, history items + rating-level embeddings, optional knowledge."""

    def __init__(self, catalog: ItemCatalog, knowledge_dim: int | None, cfg: ModelConfig) -> None:
        super().__init__()
        self.items = ItemEmbedding(catalog, cfg.embed_dim)
        self.rating = nn.Embedding(11, self.items.dim)  # half-star levels 0..10; 0 also at padding
        self.knowledge = KnowledgeInput(knowledge_dim, cfg) if knowledge_dim else None
        self.knowledge_width = self.knowledge.dim if self.knowledge is not None else 0

    def inputs(self, batch: CtrTensors) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Target ``[B, d]``, history ``[B, H, d]`` (item + rating level), history mask ``[B, H]``."""
        levels = (batch.hist_rating * 2).round().long().clamp(0, 10)
        hist = self.items(batch.hist) + self.rating(levels)
        return self.items(batch.target), hist, (batch.hist > 0).float()

    def knowledge_features(self, batch: CtrTensors) -> list[torch.Tensor]:
        return [self.knowledge(batch)] if self.knowledge is not None else []


class DIN(_CtrBase):
    """Deep Interest Network: target-aware attention pooling over the history, then an MLP tower.

    The attention unit scores each history item from ``[h, t, h - t, h * t]``; weights are not
    softmax-normalised (as in DIN) and padding gets weight 0.
    """

    def __init__(
        self, catalog: ItemCatalog, knowledge_dim: int | None = None, cfg: ModelConfig = ModelConfig()
    ) -> None:
        super().__init__(catalog, knowledge_dim, cfg)
        d = self.items.dim
        self.attention = nn.Sequential(nn.Linear(4 * d, 36), nn.PReLU(), nn.Linear(36, 1))
        self.tower = mlp([2 * d + self.knowledge_width, *cfg.mlp], cfg.dropout)
        self.out = nn.Linear(cfg.mlp[-1], 1)

    def forward(self, batch: CtrTensors) -> torch.Tensor:
        target, hist, mask = self.inputs(batch)
        t = target.unsqueeze(1).expand_as(hist)
        weights = self.attention(torch.cat([hist, t, hist - t, hist * t], -1)).squeeze(-1) * mask  # [B, H]
        pooled = (weights.unsqueeze(-1) * hist).sum(1)
        x = torch.cat([target, pooled, *self.knowledge_features(batch)], -1)
        return self.out(self.tower(x)).squeeze(-1)


class DCNv2(_CtrBase):
    """DCN-V2 (parallel): ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l`` cross layers beside a deep MLP.

    Input ``x_0`` = target item ⊕ masked mean of the history ⊕ knowledge features.
    """

    def __init__(
        self, catalog: ItemCatalog, knowledge_dim: int | None = None, cfg: ModelConfig = ModelConfig()
    ) -> None:
        super().__init__(catalog, knowledge_dim, cfg)
        width = 2 * self.items.dim + self.knowledge_width
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(cfg.cross_layers))
        self.deep = mlp([width, *cfg.mlp], cfg.dropout)
        self.out = nn.Linear(width + cfg.mlp[-1], 1)

    def forward(self, batch: CtrTensors) -> torch.Tensor:
        target, hist, mask = self.inputs(batch)
        mean_hist = (hist * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        x0 = torch.cat([target, mean_hist, *self.knowledge_features(batch)], -1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.out(torch.cat([x, self.deep(x0)], -1)).squeeze(-1)


MODELS: dict[str, type[_CtrBase]] = {"din": DIN, "dcnv2": DCNv2}


def build_model(
    name: str, catalog: ItemCatalog, knowledge_dim: int | None, cfg: ModelConfig = ModelConfig()
) -> nn.Module:
    """A CTR model by name (``din`` or ``dcnv2``); ``knowledge_dim=None`` builds it without knowledge inputs."""
    if name not in MODELS:
        raise ValueError(f"unknown CTR model {name!r}; choose from {sorted(MODELS)}")
    return MODELS[name](catalog, knowledge_dim, cfg)
