"""Brand and price facts of e-commerce item texts, matched against the item and the catalogue's brands."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import polars as pl

from pipelines.quality.facts import Grounding


MIN_BRAND_CHARS = 3
# brand values that name no brand, or that any product text uses as ordinary words
NOT_BRANDS = frozenset(
    {"generic", "unknown", "unbranded", "no brand", "none", "n/a", "various", "other", "misc", "brand", "gift card"}
)
_AMOUNT = r"(\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?)"
_MONEY = re.compile(rf"(?:US\s?\$|\$|\bUSD\s?){_AMOUNT}(?!\d)|(?<![\w.,]){_AMOUNT}\s?(?:dollars?|USD|bucks)\b", re.I)


def _brand_key(brand: object) -> str | None:
    """A brand as matched (lower case, spaces squeezed), or None for one too short or naming no brand."""
    key = " ".join(str(brand).lower().split()) if brand is not None else ""
    return key if len(key) >= MIN_BRAND_CHARS and key not in NOT_BRANDS else None


def catalogue_brands(items: pl.DataFrame) -> tuple[str, ...]:
    """The brands of the items table (its ``brand`` column; none without one) that a text's brand mention is
    matched against, lower-cased, without too short ones and non-brands (``NOT_BRANDS``)."""
    if "brand" not in items.columns:
        return ()
    return tuple(sorted({k for b in items["brand"].drop_nulls().unique().to_list() if (k := _brand_key(b))}))


def money_amounts(text: str) -> list[float]:
    """Every money amount ``text`` states (``$12.99``, ``US$5``, ``12.99 dollars``, ``USD 12``, ``$1,299``)."""
    return [float((m.group(1) or m.group(2)).replace(",", "")) for m in _MONEY.finditer(text)]


def _same_price(said: float, price: float) -> bool:
    return abs(said - price) <= max(0.01, 0.01 * abs(price)) + 1e-9


def commerce_facts(g: Grounding, text: str, item: Mapping, brands: Iterable[str]) -> None:
    """Brand facts: every catalogue brand (``brands`` + the item's own; longest first, whole words, any case)
    the text names, matched when it is the item's brand or its title names it. Price facts (items with a
    ``price`` column): every money amount the text states, matched when within 1% (at least 1 cent) of the
    item's price or an amount its title states; an item without a price supports no other amount."""
    title = str(item.get("title") or "")
    own = _brand_key(item.get("brand"))
    vocab = {k for b in brands if (k := _brand_key(b)) is not None} | ({own} if own else set())
    if vocab:
        low, title_low = text.lower(), " ".join(title.lower().split())
        for brand in sorted(vocab, key=len, reverse=True):
            if brand.split()[0] not in low:
                continue  # a cheap test first: catalogues hold thousands of brands
            pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, brand.split())) + r"(?!\w)"
            if re.search(pattern, low):
                g.add("brands", brand == own or re.search(pattern, title_low) is not None)
                low = re.sub(pattern, " ", low)  # a shorter brand inside this one is not a second mention
    if "price" in item:
        price, shown = item.get("price"), money_amounts(title)
        for said in money_amounts(text):
            g.add("prices", any(_same_price(said, p) for p in ([price] if price is not None else []) + shown))
