"""Numbered schema migrations of the PostgreSQL store: the same numbers as ``migrations.py``
(SQLite's), each making the same tables, columns and index names; ``phalanx_schema`` records
how many ran. Append only, like SQLite's.

What differs, and why:

- text is ``TEXT COLLATE "C"``: byte order, as SQLite compares, so an id prefix is an index
  range (``keys.prefix_range``) and sorts agree whatever the database's locale;
- ``REAL`` is ``DOUBLE PRECISION`` (PostgreSQL's ``REAL`` is 4 bytes: times would lose their
  fraction and listing cursors their exactness); ``INTEGER`` is ``BIGINT`` (SQLite's is 8 bytes);
- the ``ids`` triggers insert a statement's new ids at once (a transition table), so a bulk
  ``COPY`` pays one insert per statement, not one per row.
"""

from __future__ import annotations

T = 'TEXT COLLATE "C"'

PG_MIGRATIONS: tuple[str, ...] = (
    # 1: jobs
    f"""
    CREATE TABLE jobs (
        id {T} PRIMARY KEY,
        name {T} NOT NULL,
        state {T} NOT NULL,
        backend {T} NOT NULL,
        nnodes BIGINT NOT NULL,
        nproc_per_node BIGINT NOT NULL,
        command {T} NOT NULL,
        job_dir {T} NOT NULL,
        spec_json {T} NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        ended_at DOUBLE PRECISION,
        exit_code BIGINT,
        attempt BIGINT NOT NULL DEFAULT 0,
        supervisor_pid BIGINT,
        supervisor_started DOUBLE PRECISION,
        root_cause {T}
    );
    CREATE INDEX jobs_created ON jobs (created_at);
    CREATE INDEX jobs_name ON jobs (name, created_at);
    CREATE INDEX jobs_state ON jobs (state);
    """,
    # 2: survival
    """
    ALTER TABLE jobs ADD COLUMN state_synced_at DOUBLE PRECISION;
    ALTER TABLE jobs ADD COLUMN retries BIGINT NOT NULL DEFAULT 0;
    """,
    # 3: sweeps, and jobs as their trials
    f"""
    CREATE TABLE sweeps (
        id {T} PRIMARY KEY,
        name {T} NOT NULL,
        state {T} NOT NULL,
        strategy {T} NOT NULL,
        objective {T},
        direction {T},
        total BIGINT,
        launched BIGINT NOT NULL DEFAULT 0,
        finished BIGINT NOT NULL DEFAULT 0,
        failed BIGINT NOT NULL DEFAULT 0,
        pruned BIGINT NOT NULL DEFAULT 0,
        best_job {T},
        best_value DOUBLE PRECISION,
        best_params {T},
        command {T} NOT NULL,
        topology {T} NOT NULL,
        spec_json {T} NOT NULL,
        settings_json {T} NOT NULL,
        sweep_dir {T} NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        ended_at DOUBLE PRECISION,
        supervisor_pid BIGINT,
        supervisor_started DOUBLE PRECISION
    );
    CREATE INDEX sweeps_created ON sweeps (created_at);
    ALTER TABLE jobs ADD COLUMN sweep_id {T};
    ALTER TABLE jobs ADD COLUMN trial BIGINT;
    ALTER TABLE jobs ADD COLUMN params_json {T};
    ALTER TABLE jobs ADD COLUMN objective DOUBLE PRECISION;
    CREATE INDEX jobs_sweep ON jobs (sweep_id, trial);
    """,
    # 4: a store that stays flat at a million jobs (see migrations.py)
    f"""
    DROP INDEX jobs_sweep;
    CREATE INDEX jobs_trials ON jobs (sweep_id, trial) WHERE sweep_id IS NOT NULL;
    DROP INDEX jobs_created;
    CREATE INDEX jobs_created ON jobs (created_at, id);
    CREATE INDEX jobs_top ON jobs (created_at, id) WHERE sweep_id IS NULL;
    CREATE INDEX sweeps_name ON sweeps (name, created_at);
    CREATE INDEX sweeps_state ON sweeps (state);
    CREATE TABLE ids (id {T} PRIMARY KEY);
    INSERT INTO ids (id) SELECT id FROM jobs ON CONFLICT DO NOTHING;
    INSERT INTO ids (id) SELECT id FROM sweeps ON CONFLICT DO NOTHING;
    CREATE FUNCTION phalanx_take_ids() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    BEGIN
        INSERT INTO ids (id) SELECT id FROM new_rows ON CONFLICT DO NOTHING;
        RETURN NULL;
    END $$;
    CREATE TRIGGER jobs_id AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION phalanx_take_ids();
    CREATE TRIGGER sweeps_id AFTER INSERT ON sweeps REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION phalanx_take_ids();
    """,
    # 5: the control room (issue 16): tags, metric summaries, usage
    f"""
    ALTER TABLE jobs ADD COLUMN gpu_hours DOUBLE PRECISION;
    ALTER TABLE jobs ADD COLUMN cpu_hours DOUBLE PRECISION;
    ALTER TABLE jobs ADD COLUMN cost DOUBLE PRECISION;
    CREATE TABLE tags (id {T} NOT NULL, key {T} NOT NULL, value {T} NOT NULL, PRIMARY KEY (id, key));
    CREATE INDEX tags_kv ON tags (key, value, id);
    CREATE TABLE job_metrics (
        id {T} NOT NULL,
        name {T} NOT NULL,
        last DOUBLE PRECISION NOT NULL,
        min DOUBLE PRECISION NOT NULL,
        max DOUBLE PRECISION NOT NULL,
        count BIGINT NOT NULL,
        step BIGINT,
        PRIMARY KEY (id, name)
    );
    CREATE INDEX job_metrics_last ON job_metrics (name, last, id);
    CREATE INDEX job_metrics_min ON job_metrics (name, min, id);
    CREATE INDEX job_metrics_max ON job_metrics (name, max, id);
    """,
    # 6: the team: who submitted each job and sweep, and its project
    f"""
    ALTER TABLE jobs ADD COLUMN user_name {T};
    ALTER TABLE jobs ADD COLUMN project {T} NOT NULL DEFAULT 'default';
    ALTER TABLE sweeps ADD COLUMN user_name {T};
    ALTER TABLE sweeps ADD COLUMN project {T} NOT NULL DEFAULT 'default';
    CREATE INDEX jobs_user ON jobs (user_name, created_at, id) WHERE sweep_id IS NULL;
    """,
    # 7: the users of a team server and their API tokens (stored as salted scrypt hashes)
    f"""
    CREATE TABLE users (
        name {T} PRIMARY KEY,
        admin BIGINT NOT NULL DEFAULT 0,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION
    );
    CREATE TABLE tokens (
        id {T} PRIMARY KEY,
        user_name {T} NOT NULL,
        salt {T} NOT NULL,
        hash {T} NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION
    );
    """,
    # 8: teams (issue 27): projects with quotas, budget and cluster queues; members; a user's
    # default project; the audit log, append-only (a trigger refuses every UPDATE); per job its
    # priority, GPUs, CPUs and when admission let it start (see migrations.py)
    f"""
    CREATE TABLE projects (
        name {T} PRIMARY KEY,
        created_at DOUBLE PRECISION NOT NULL,
        max_gpus BIGINT,
        max_cpus BIGINT,
        max_jobs BIGINT,
        budget DOUBLE PRECISION,
        budget_unit {T},
        kueue_queue {T},
        slurm_account {T},
        slurm_qos {T},
        version BIGINT NOT NULL DEFAULT 0
    );
    INSERT INTO projects (name, created_at) VALUES ('default', extract(epoch FROM now()));
    CREATE TABLE members (
        project {T} NOT NULL,
        user_name {T} NOT NULL,
        role {T} NOT NULL,
        added_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (project, user_name)
    );
    INSERT INTO members (project, user_name, role, added_at)
        SELECT 'default', name, 'member', created_at FROM users WHERE revoked_at IS NULL;
    ALTER TABLE users ADD COLUMN default_project {T};
    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at DOUBLE PRECISION NOT NULL,
        user_name {T} NOT NULL,
        address {T},
        action {T} NOT NULL,
        target {T},
        project {T},
        outcome {T} NOT NULL,
        detail {T}
    );
    CREATE INDEX events_at ON events (at);
    CREATE INDEX events_project ON events (project, at);
    CREATE FUNCTION phalanx_events_append_only() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    BEGIN
        RAISE EXCEPTION 'the audit log is append-only';
    END $$;
    CREATE TRIGGER events_append_only BEFORE UPDATE ON events
        FOR EACH ROW EXECUTE FUNCTION phalanx_events_append_only();
    ALTER TABLE jobs ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN gpus BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN cpus BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN admitted_at DOUBLE PRECISION;
    ALTER TABLE sweeps ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
    CREATE INDEX jobs_queue ON jobs (project, priority DESC, created_at, id)
        WHERE state = 'QUEUED' AND admitted_at IS NULL;
    CREATE INDEX jobs_holding ON jobs (project)
        WHERE admitted_at IS NOT NULL AND state IN ('PENDING', 'QUEUED', 'RUNNING', 'STOPPING');
    CREATE INDEX jobs_project ON jobs (project, created_at, id);
    """,
    # 9: leases of the jobs a team server's replicas supervise (holder, expiry)
    f"""
    ALTER TABLE jobs ADD COLUMN lease_holder {T};
    ALTER TABLE jobs ADD COLUMN lease_expires DOUBLE PRECISION;
    CREATE INDEX jobs_lease ON jobs (lease_holder, lease_expires) WHERE lease_holder IS NOT NULL;
    """,
    # 10: the secrets a team server keeps, per user and per project, as AES-256-GCM ciphertext
    f"""
    CREATE TABLE secrets (
        scope {T} NOT NULL,
        owner {T} NOT NULL,
        name {T} NOT NULL,
        ciphertext {T} NOT NULL,
        nonce {T} NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        set_by {T} NOT NULL,
        PRIMARY KEY (scope, owner, name)
    );
    """,
    # 11: the machine a job's (or sweep's) supervisor runs on (its pid means something there only);
    # sweeps' leases
    f"""
    ALTER TABLE jobs ADD COLUMN supervisor_host {T};
    ALTER TABLE sweeps ADD COLUMN supervisor_host {T};
    ALTER TABLE sweeps ADD COLUMN lease_holder {T};
    ALTER TABLE sweeps ADD COLUMN lease_expires DOUBLE PRECISION;
    CREATE INDEX sweeps_lease ON sweeps (lease_holder, lease_expires) WHERE lease_holder IS NOT NULL;
    """,
)
