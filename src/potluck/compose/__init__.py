"""How ``potluck.prepare`` composes its parts: the table of what cannot go together
(``table``) and the builders of each concern's parts (``parts``)."""
