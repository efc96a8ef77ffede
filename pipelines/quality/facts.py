"""The facts a text mentions and how many of them its input supports (the grounding of every domain)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Grounding:
    """Facts a text mentions and how many of them the input supports, per kind (titles, genres, ratings, years,
    brands, prices)."""

    mentioned: dict[str, int] = field(default_factory=dict)
    matched: dict[str, int] = field(default_factory=dict)
    unsupported_genres: list[str] = field(default_factory=list)  # genres named that the input does not have

    def add(self, kind: str, ok: bool) -> None:
        self.mentioned[kind] = self.mentioned.get(kind, 0) + 1
        self.matched[kind] = self.matched.get(kind, 0) + int(ok)

    def add_genre(self, genre: str, ok: bool) -> None:
        self.add("genres", ok)
        if not ok:
            self.unsupported_genres.append(genre)

    @property
    def n_mentioned(self) -> int:
        return sum(self.mentioned.values())

    @property
    def n_matched(self) -> int:
        return sum(self.matched.values())

    @property
    def share(self) -> float | None:
        """matched / mentioned, None when the text mentions nothing checkable."""
        return self.n_matched / self.n_mentioned if self.n_mentioned else None
