"""One exception tree for durabl.

Every class's docstring reads as its default message. An error that needs details takes them as
named fields and composes its own message from them, so that each message is written once and no
code has to recognise an error by its words. Errors a user can cause derive from ``DurablError``
(an ``Exception``); the only ``BaseException`` in durabl is the chaos harness's simulated process
death (``durabl.crashpoints.ProcessDeath``), so that no ``except Exception`` in the runtime or in a
workflow can swallow it.

A class declared with ``refines=True`` is one of the messages of the class it derives from, split
off so that it can carry its own fields. Catch the class it refines; reports still name that one
(``described``), so that splitting a class changes no report.

The tree lives in three modules: ``base`` (the root), ``storage`` (the database file and the
history in it) and ``runs`` (driving a run: ownership, state, workflows, steps, tools). Import
from ``durabl.errors``.
"""

from durabl.errors.base import (
    DurablError,
    described,
)
from durabl.errors.runs import (
    AlreadyTerminalError,
    AmbiguousEffect,
    CommandFailed,
    CommandTimedOut,
    DeadLetteredError,
    DeadLetterEventMissingError,
    EffectAlreadyRecordedError,
    EncodingError,
    IdempotencyKeyConflict,
    InvalidStateError,
    LeaseLost,
    ModelCallFailed,
    NoModelError,
    NonDeterminismError,
    NotDeadLetteredError,
    RunConflictError,
    RunDrivenElsewhere,
    RunDrivenHere,
    RunFailedError,
    RunLeased,
    RunNotFinishedError,
    RunNotFoundError,
    RunTakenOver,
    StepFailed,
    ToolFailed,
    UnknownToolError,
    UnknownWorkflowError,
    not_a_step,
)
from durabl.errors.storage import (
    ChecksumError,
    CompactedLogGapError,
    DirectoryNotFileError,
    EmptyFileError,
    EventChecksumError,
    ForeignDatabaseError,
    ForeignSchemaError,
    HistoryRewriteError,
    InvariantError,
    LogGapError,
    MissingFileError,
    MissingSnapshotError,
    NoRunToCompactError,
    NotADatabaseError,
    NotSQLiteError,
    PostgresDriverMissingError,
    PostgresError,
    ReadOnlyPathError,
    SchemaVersionError,
    ServerUnreachableError,
    SideEffectExistsError,
    SnapshotChecksumError,
    SQLiteCantOpenError,
    SQLiteCorruptError,
    SQLiteError,
    SQLiteFullError,
    SQLiteReadOnlyError,
    StorageError,
    StoreClosedError,
    TruncatedFileError,
    UninitialisedError,
    UnknownEventKindError,
    UnknownSnapshotFormatError,
    WalModeError,
)

__all__ = [
    "AlreadyTerminalError",
    "AmbiguousEffect",
    "ChecksumError",
    "CommandFailed",
    "CommandTimedOut",
    "CompactedLogGapError",
    "DeadLetterEventMissingError",
    "DeadLetteredError",
    "DirectoryNotFileError",
    "DurablError",
    "EffectAlreadyRecordedError",
    "EmptyFileError",
    "EncodingError",
    "EventChecksumError",
    "ForeignDatabaseError",
    "ForeignSchemaError",
    "HistoryRewriteError",
    "IdempotencyKeyConflict",
    "InvalidStateError",
    "InvariantError",
    "LeaseLost",
    "LogGapError",
    "MissingFileError",
    "MissingSnapshotError",
    "ModelCallFailed",
    "NoModelError",
    "NoRunToCompactError",
    "NonDeterminismError",
    "NotADatabaseError",
    "NotDeadLetteredError",
    "NotSQLiteError",
    "PostgresDriverMissingError",
    "PostgresError",
    "ReadOnlyPathError",
    "RunConflictError",
    "RunDrivenElsewhere",
    "RunDrivenHere",
    "RunFailedError",
    "RunLeased",
    "RunNotFinishedError",
    "RunNotFoundError",
    "RunTakenOver",
    "SQLiteCantOpenError",
    "SQLiteCorruptError",
    "SQLiteError",
    "SQLiteFullError",
    "SQLiteReadOnlyError",
    "SchemaVersionError",
    "ServerUnreachableError",
    "SideEffectExistsError",
    "SnapshotChecksumError",
    "StepFailed",
    "StorageError",
    "StoreClosedError",
    "ToolFailed",
    "TruncatedFileError",
    "UninitialisedError",
    "UnknownEventKindError",
    "UnknownSnapshotFormatError",
    "UnknownToolError",
    "UnknownWorkflowError",
    "WalModeError",
    "described",
    "not_a_step",
]

# Tracebacks and pickles name every class by the module users import it from.
for _name in __all__:
    globals()[_name].__module__ = __name__
