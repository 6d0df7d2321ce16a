"""Runs of a whole file: what makes a long compression safe to run and to resume.

:mod:`.preflight` checks a run's paths, formats and outputs before any work; :mod:`.driver`
is the skeleton of a compress run (checks, lock, the merger behind its journal) that
:mod:`.single` (in memory) and :mod:`.budgeted` share. :mod:`.budgeted` compresses a store
bigger than memory one group of whole tenants at a time
(:mod:`.budget_groups` packs the groups, :mod:`.budget_files` splits the input and writes the
output from the parts); :mod:`.journal` appends every finished merge so an interrupted run
resumes without redoing it; :mod:`.outputs` checks an output path before any work and locks
it while the run writes; :mod:`.compact_run` keeps a store file within a budget per tenant in
place (:mod:`.compact_files`: the pass-through of untouched rows; :mod:`.inbox` and
:mod:`.inbox_files`: the inbox's records and files), and :mod:`.compacting_store` is that
for a service that adds memories as they come.
"""
from .budgeted import BudgetedResult, compress_budgeted, compress_file_budgeted
from .compact_run import CompactFileResult, compact_file
from .compacting_store import CompactingStore
from .driver import MergerFailedError
from .journal import JournaledMerger, JournalExistsError, JournalWriteError, journal_path, run_fingerprint
from .outputs import OutputLock, check_not_input, check_output
from .preflight import check_store

__all__ = ["compact_file", "CompactingStore", "CompactFileResult", "compress_budgeted", "compress_file_budgeted",
           "BudgetedResult", "JournaledMerger", "JournalWriteError",
           "journal_path", "run_fingerprint", "OutputLock", "check_output", "check_not_input",
           "check_store", "MergerFailedError", "JournalExistsError"]
