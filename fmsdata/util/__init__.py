"""The lowest layer: what every other layer may use and that knows nothing of them.

Compiled kernels (``compiled``), work at interpreter exit (``exits``), optional packages
(``extras``), a read-ahead thread (``threads``), zip writing (``zipwrite``), keyed
permutations and hashes (``permute``), the strict reading of saved states
(``statecheck``), which path values are URLs (``urls``) and the bundled text corpus and
tokenizer (``textcorpus``).
"""
