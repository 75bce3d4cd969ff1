"""Machine shaping for the benches and demos: a CPU quota for some processes
(``cpu_quota``, a cgroup of their own) and two hosts joined by a rate-limited link
(``netns``, network namespaces)."""
