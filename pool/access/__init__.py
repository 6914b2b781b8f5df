"""Access: who may open a session, and on which unit.

``connect.admit`` is the one admission function every transport calls: the origin and the
credentials (``keys`` for their shapes and hashes, ``auth`` for keys, origins and the client's
address behind trusted proxies), this process's own counts (``accounting``: sessions per key, the
connect rate), the process's state, and the claim of a unit honouring the cluster's reservations
(``admission``, which also issues and redeems client secrets). Its database calls run on threads
of their own with short timeouts (``database``).

It may import Django's ORM (``pool.models``) and the pipeline's registry; nothing of ``realtime``.
"""
