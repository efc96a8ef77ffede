"""Title clean-up shared by the loaders: ``"Usual Suspects, The (1995)"`` -> ``"The Usual Suspects"``, 1995."""

from __future__ import annotations

import polars as pl

# "Name (1995)" or "Name (2006-2007)" at the end of a title
_YEAR = r"^(.*?)\s*\((\d{4})(?:\s*[-–]\s*\d{4})?\)\s*$"
# "Name, The" (optionally followed by an alternative title in parentheses) -> "The Name"
_TRAILING_ARTICLE = r"^(.*), (The|A|An)( \(.*\))?$"


def split_title_year(column: str = "title") -> list[pl.Expr]:
    """Expressions giving ``title`` without its trailing year (leading article restored) and ``year``."""
    raw = pl.col(column).str.strip_chars()
    name = pl.coalesce(raw.str.extract(_YEAR, 1), raw)
    return [
        name.str.replace(_TRAILING_ARTICLE, "${2} ${1}${3}").alias("title"),
        raw.str.extract(_YEAR, 2).cast(pl.Int32).alias("year"),
    ]
