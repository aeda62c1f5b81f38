"""Warm starts: Python processes forked from a pool that has done interpreter start-up and the
heavy imports already (``plan``: which processes of a plan start warm, and the pools of this user;
``standin``: the client a plan starts instead of the cold process; ``pool``, ``server``, ``child``,
``checks``, ``recorder``, ``proto``: the pool). Kept empty of imports: the stand-in is stdlib-only
and starts on every warm process."""
