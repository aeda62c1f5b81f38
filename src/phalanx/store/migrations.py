"""Numbered schema migrations; ``PRAGMA user_version`` records how many ran.

Append only: never edit a migration that has shipped.
"""

MIGRATIONS: tuple[str, ...] = (
    # 1: jobs
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        backend TEXT NOT NULL,
        nnodes INTEGER NOT NULL,
        nproc_per_node INTEGER NOT NULL,
        command TEXT NOT NULL,
        job_dir TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        attempt INTEGER NOT NULL DEFAULT 0,
        supervisor_pid INTEGER,
        supervisor_started REAL,
        root_cause TEXT
    );
    CREATE INDEX jobs_created ON jobs (created_at);
    CREATE INDEX jobs_name ON jobs (name, created_at);
    CREATE INDEX jobs_state ON jobs (state);
    """,
    # 2: survival: when the state directory last reached its remote copy; retries used
    """
    ALTER TABLE jobs ADD COLUMN state_synced_at REAL;
    ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
    """,
    # 3: sweeps, and jobs as their trials
    """
    CREATE TABLE sweeps (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        strategy TEXT NOT NULL,
        objective TEXT,
        direction TEXT,
        total INTEGER,
        launched INTEGER NOT NULL DEFAULT 0,
        finished INTEGER NOT NULL DEFAULT 0,
        failed INTEGER NOT NULL DEFAULT 0,
        pruned INTEGER NOT NULL DEFAULT 0,
        best_job TEXT,
        best_value REAL,
        best_params TEXT,
        command TEXT NOT NULL,
        topology TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        settings_json TEXT NOT NULL,
        sweep_dir TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        supervisor_pid INTEGER,
        supervisor_started REAL
    );
    CREATE INDEX sweeps_created ON sweeps (created_at);
    ALTER TABLE jobs ADD COLUMN sweep_id TEXT;
    ALTER TABLE jobs ADD COLUMN trial INTEGER;
    ALTER TABLE jobs ADD COLUMN params_json TEXT;
    ALTER TABLE jobs ADD COLUMN objective REAL;
    CREATE INDEX jobs_sweep ON jobs (sweep_id, trial);
    """,
)
