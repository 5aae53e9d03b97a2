"""A multi-tenant chat workload: several tenants (products, teams, customers of a platform), each with its own
long system prompt, and many users per tenant asking short questions.

This is the traffic where routing decides the prefix-cache hit rate: every request of a tenant starts with the
same few hundred tokens, which a replica computes once and then reads from its prefix cache, but only if the
tenant's next request lands on the replica that holds them. Each tenant's prompt differs from the others' from
its first sentence, so two tenants share nothing but the chat template's first few tokens.

``run`` goes into the first sentence of every prompt: two runs of the same workload with different ``run``
numbers share no prefix, so each run starts from cold caches, as a freshly started fleet would, without
restarting the replicas.
"""

from __future__ import annotations

import random

from workbench.workloads import NAMES, WorkloadRequest, questions

TENANTS = [
    ("Northwind Library", "the city library's help desk"),
    ("Bluefin Bikes", "a bicycle repair shop's support line"),
    ("Orchard Health", "a clinic's appointment desk"),
    ("Copperleaf Bank", "a bank's card services"),
    ("Meadow Rail", "a regional railway's ticket office"),
    ("Harbor Freight Co", "a shipping company's tracking desk"),
    ("Pinecrest Hotel", "a hotel's front desk"),
    ("Silverline Telecom", "a phone company's billing support"),
    ("Quarry Lane School", "a school's parent office"),
    ("Foxglove Garden Centre", "a garden centre's plant advice line"),
    ("Tidewater Utilities", "a water utility's outage line"),
    ("Kestrel Airlines", "an airline's baggage service"),
]
_RULES = [
    "Greet the customer by name when they give it, and keep every answer under three sentences.",
    "Opening hours are nine to five on weekdays and ten to two on Saturdays; say so when asked.",
    "Never promise a refund: explain that a colleague reviews every refund request within five working days.",
    "When a question is about a price, quote only the prices in this prompt and say that others vary.",
    "Escalate anything about safety, health or legal matters to a human colleague at once.",
    "Customers may change a booking free of charge up to one day ahead, later for a small fee.",
    "Do not ask for passwords, card numbers or any secret; if a customer offers one, tell them to stop.",
    "Answer in the language the customer writes in, and keep a friendly, plain tone.",
    "If you do not know an answer, say so and offer to pass the question to a colleague.",
    "End every answer by asking whether there is anything else you can help with.",
]


def tenant_prompt(tenant: int, *, sentences: int = 8, run: int = 0) -> str:
    """Tenant number ``tenant``'s system prompt: who it is, then ``sentences`` of its standing rules."""
    if not isinstance(tenant, int) or not 0 <= tenant < len(TENANTS):
        raise ValueError(f"tenant must be an integer in [0, {len(TENANTS) - 1}], got {tenant!r}")
    name, what = TENANTS[tenant]
    rng = random.Random(tenant)
    rules = [_RULES[i % len(_RULES)] for i in rng.sample(range(len(_RULES)), len(_RULES))]
    body = " ".join(f"Rule {i + 1}: {rules[i % len(rules)]}" for i in range(sentences))
    return f"{name} (session {run}). You are the assistant of {name}, {what}. {body}"


def tenant_workload(tenants: int, users_per_tenant: int, *, sentences: int = 8, max_tokens: int = 4,
                    run: int = 0, seed: int = 0) -> list[WorkloadRequest]:
    """``tenants`` x ``users_per_tenant`` chat requests in a seeded random order, each tagged with its tenant.
    Answers are ``max_tokens`` long exactly (``ignore_eos``): the lesson is where prompts go, not the text."""
    if not isinstance(tenants, int) or not 1 <= tenants <= len(TENANTS):
        raise ValueError(f"tenants must be an integer in [1, {len(TENANTS)}], got {tenants!r}")
    if not isinstance(users_per_tenant, int) or users_per_tenant < 1:
        raise ValueError(f"users_per_tenant must be an integer >= 1, got {users_per_tenant!r}")
    asks = questions(tenants * users_per_tenant, seed)
    requests = []
    for t in range(tenants):
        system = tenant_prompt(t, sentences=sentences, run=run)
        for u in range(users_per_tenant):
            user = NAMES[(t + u) % len(NAMES)]
            requests.append(WorkloadRequest(f"{user} asks: {asks[t * users_per_tenant + u]}", max_tokens,
                                            system=system, ignore_eos=True,
                                            tags={"tenant": TENANTS[t][0], "user": f"{user} {u}"}))
    random.Random(seed).shuffle(requests)
    return requests
