"""``potluck demo``: train a tiny character-level transformer on the Python stdlib's
own source, on N local workers with ``potluck.DataParallel``, and report the figures.
``potluck demo --chaos`` trains it elastically and kills and restores a worker mid-run;
``potluck demo --uneven`` balances it over workers of which one is slowed (``uneven.py``)."""
