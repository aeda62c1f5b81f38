"""Numbered schema migrations of the SQLite store; ``PRAGMA user_version`` records how many ran.

Append only: never edit a migration that has shipped. A migration is a script of statements
separated by ``;`` (a trigger's body may hold ``;`` too: statements are split where SQLite
says one is complete). ``pgmigrations.py`` holds the same numbers for PostgreSQL: migration N
makes the same tables, columns and index names on both (``tests/unit/test_store_engines.py``
compares them); add a migration to both, or to neither.
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
    # 4: a store that stays flat at a million jobs (pinned by tests/unit/test_store_plans.py).
    # - jobs_sweep (sweep_id, trial) also indexed the top-level jobs (sweep_id NULL), and the
    #   planner took it for `ps --all`, then sorted every row: trials only now.
    # - jobs_top: top-level jobs newest first, in the order listings page through them
    #   (keyset on created_at, id).
    # - sweeps by name (status/stop NAME) and by state (ps: the active ones).
    # - ids: every id ever handed out (jobs and sweeps), so a new one is checked against all.
    """
    DROP INDEX jobs_sweep;
    CREATE INDEX jobs_trials ON jobs (sweep_id, trial) WHERE sweep_id IS NOT NULL;
    DROP INDEX jobs_created;
    CREATE INDEX jobs_created ON jobs (created_at, id);
    CREATE INDEX jobs_top ON jobs (created_at, id) WHERE sweep_id IS NULL;
    CREATE INDEX sweeps_name ON sweeps (name, created_at);
    CREATE INDEX sweeps_state ON sweeps (state);
    CREATE TABLE ids (id TEXT PRIMARY KEY) WITHOUT ROWID;
    INSERT OR IGNORE INTO ids (id) SELECT id FROM jobs;
    INSERT OR IGNORE INTO ids (id) SELECT id FROM sweeps;
    CREATE TRIGGER jobs_id AFTER INSERT ON jobs BEGIN INSERT OR IGNORE INTO ids (id) VALUES (new.id); END;
    CREATE TRIGGER sweeps_id AFTER INSERT ON sweeps BEGIN INSERT OR IGNORE INTO ids (id) VALUES (new.id); END;
    """,
    # 5: the control room (issue 16). Tags of jobs and sweeps (--tag KEY=VALUE; ids are unique
    # across both); each finished job's metric summary (the dashboard's metric columns sort by
    # it); and what a job used (GPU- and CPU-hours, estimated cost), recorded when it ends.
    """
    ALTER TABLE jobs ADD COLUMN gpu_hours REAL;
    ALTER TABLE jobs ADD COLUMN cpu_hours REAL;
    ALTER TABLE jobs ADD COLUMN cost REAL;
    CREATE TABLE tags (id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (id, key)) WITHOUT ROWID;
    CREATE INDEX tags_kv ON tags (key, value, id);
    CREATE TABLE job_metrics (
        id TEXT NOT NULL,
        name TEXT NOT NULL,
        last REAL NOT NULL,
        min REAL NOT NULL,
        max REAL NOT NULL,
        count INTEGER NOT NULL,
        step INTEGER,
        PRIMARY KEY (id, name)
    ) WITHOUT ROWID;
    CREATE INDEX job_metrics_last ON job_metrics (name, last, id);
    CREATE INDEX job_metrics_min ON job_metrics (name, min, id);
    CREATE INDEX job_metrics_max ON job_metrics (name, max, id);
    """,
    # 6: the team (issue 22, and the projects of issue 27): who submitted each job and sweep
    # (NULL: before users were recorded) and its project. `ps --user` walks jobs_user in the
    # listing's order, as `ps` walks jobs_top. One index only: every connection parses the
    # schema when it opens, so each index costs every command a little (sweeps are few; an
    # index by project comes with the listings that filter by it).
    """
    ALTER TABLE jobs ADD COLUMN user_name TEXT;
    ALTER TABLE jobs ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE sweeps ADD COLUMN user_name TEXT;
    ALTER TABLE sweeps ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
    CREATE INDEX jobs_user ON jobs (user_name, created_at, id) WHERE sweep_id IS NULL;
    """,
    # 7: the users of a team server (issue 22) and their API tokens. A token is shown once and
    # stored as a slow hash (scrypt, a salt per token); its public id (the token's first part)
    # is the key, so checking a token reads one row. Revoked users and tokens stay, dated, so
    # jobs keep naming who submitted them (the audit log of issue 27 refers to them too). No
    # index by user: a team's tokens are few, and every connection parses each index.
    """
    CREATE TABLE users (
        name TEXT PRIMARY KEY,
        admin INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        user_name TEXT NOT NULL,
        salt TEXT NOT NULL,
        hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    """,
    # 8: teams (issue 27). Projects with their quotas (concurrent GPUs, CPUs, jobs), a monthly
    # budget (GPU-hours or money) and the cluster queues that enforce them (a Kueue LocalQueue, a
    # SLURM account and QOS); who is in each and with which role; a user's default project; the
    # audit log, append-only (a trigger refuses every UPDATE; retention deletes old rows); and
    # per job its priority, what it asks for (GPUs, CPUs) and when admission let it start
    # (admitted_at: it holds its share of the quota from then until it ends). Every existing
    # user is a member of 'default', where every job so far is: nothing they saw disappears.
    # jobs_queue: a project's queue in admission order (its head is read without sorting the
    # rest); jobs_holding: what a project's admitted jobs hold (not a scan of all its jobs);
    # jobs_project: `ps --project`, budgets. The queries spell the partial indexes' conditions
    # as literals (queue.py), as SQLite needs to use them.
    """
    CREATE TABLE projects (
        name TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        max_gpus INTEGER,
        max_cpus INTEGER,
        max_jobs INTEGER,
        budget REAL,
        budget_unit TEXT,
        kueue_queue TEXT,
        slurm_account TEXT,
        slurm_qos TEXT,
        version INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO projects (name, created_at) VALUES ('default', CAST(strftime('%s', 'now') AS REAL));
    CREATE TABLE members (
        project TEXT NOT NULL,
        user_name TEXT NOT NULL,
        role TEXT NOT NULL,
        added_at REAL NOT NULL,
        PRIMARY KEY (project, user_name)
    );
    INSERT INTO members (project, user_name, role, added_at)
        SELECT 'default', name, 'member', created_at FROM users WHERE revoked_at IS NULL;
    ALTER TABLE users ADD COLUMN default_project TEXT;
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        at REAL NOT NULL,
        user_name TEXT NOT NULL,
        address TEXT,
        action TEXT NOT NULL,
        target TEXT,
        project TEXT,
        outcome TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_at ON events (at);
    CREATE INDEX events_project ON events (project, at);
    CREATE TRIGGER events_append_only BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
    ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN admitted_at REAL;
    ALTER TABLE sweeps ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX jobs_queue ON jobs (project, priority DESC, created_at, id)
        WHERE state = 'QUEUED' AND admitted_at IS NULL;
    CREATE INDEX jobs_holding ON jobs (project)
        WHERE admitted_at IS NOT NULL AND state IN ('PENDING', 'QUEUED', 'RUNNING', 'STOPPING');
    CREATE INDEX jobs_project ON jobs (project, created_at, id);
    """,
    # 9: leases of the jobs a team server's replicas supervise (issue 22, high availability):
    # who holds each (a replica's id) and until when. Columns of the job's row, so the lease is
    # made in the statement that records the job (no job of a server without one). Released when
    # the job ends: the index holds the few jobs running under a server, not every job.
    """
    ALTER TABLE jobs ADD COLUMN lease_holder TEXT;
    ALTER TABLE jobs ADD COLUMN lease_expires REAL;
    CREATE INDEX jobs_lease ON jobs (lease_holder, lease_expires) WHERE lease_holder IS NOT NULL;
    """,
    # 10: the secrets a team server keeps (issue 27; ``secrets/server.py``): per user (scope
    # 'user', owner the user) and per project (scope 'project', owner the project), the value
    # AES-256-GCM ciphertext under the operator's key (base64, with its nonce): never plain text.
    """
    CREATE TABLE secrets (
        scope TEXT NOT NULL,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        ciphertext TEXT NOT NULL,
        nonce TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        set_by TEXT NOT NULL,
        PRIMARY KEY (scope, owner, name)
    );
    """,
    # 11: the machine a job's (or sweep's) supervisor runs on (``supervise/liveness.py``): its
    # pid means something there only, so a team server's replica on another machine judges it by
    # the job's lease instead (NULL: a row from before, or of this machine). Sweeps get leases as
    # jobs did in 9 (a sweep's runner stamps its lease on its running trials).
    """
    ALTER TABLE jobs ADD COLUMN supervisor_host TEXT;
    ALTER TABLE sweeps ADD COLUMN supervisor_host TEXT;
    ALTER TABLE sweeps ADD COLUMN lease_holder TEXT;
    ALTER TABLE sweeps ADD COLUMN lease_expires REAL;
    CREATE INDEX sweeps_lease ON sweeps (lease_holder, lease_expires) WHERE lease_holder IS NOT NULL;
    """,
)
