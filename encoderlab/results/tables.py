"""Markdown tables of the experiment summaries and the benchmark results."""


def markdown_lines(header, rows) -> list[str]:
    """The lines of a Markdown table: `header`, its rule, one line per row of cells (each shown with ``str``)."""
    return [
        "| " + " | ".join(map(str, header)) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(map(str, row)) + " |" for row in rows),
    ]


def markdown_table(header, rows) -> str:
    """`markdown_lines` as one string, without a final newline."""
    return "\n".join(markdown_lines(header, rows))
