"""Trees of drafts: the branches each verify row adds to its line of drafts in a step.

A row's line (its proposal's tokens, cut by adaptive k) is what its drafter likes best; a tree adds the
alternatives the drafters already hold, at no drafting cost:
- a second-best token at a line position (the draft model's runner-up, from ALT_FLOOR of its probability);
- other continuations that lookup found (further n-gram matches; the lookup drafts that lost to the draft
  model), hung where they leave the line, merged as a trie.
A node's chance: the line's chance of reaching its parent (the requests' acceptance estimates) times the engine's
estimate that the target takes such a node where its path reaches the parent (a runner-up by its drafter's
probability bucket; a lookup branch's first node; a node after a taken one), which every verify teaches.
Which to verify: every candidate node of the step's rows, likeliest first, while one more verify row raises the
step's expected tokens per second under the measured step-cost curve (StepCosts), the rule adaptive.allocate
cuts lines by. At one stream a CPU forward streams its weights and a row costs little, so likely alternatives
are verified; at many streams rows are dear and trees shrink to lines. A node's parent is always verified first.
Guided requests: a node is verified only if the grammar accepts its path, and its mask row (StepMasks rows are by
verify row index) is filled from the matcher state after it.
Not branched: requests whose verify needs the row as a line (repetition penalties, logprobs, rejection sampling).
"""

from __future__ import annotations

from ..drafting import registry
from ..drafting.acceptance import Population
from ..drafting.proposal import Branch, Proposal
from ..faults import Faults
from ..grammar.masks import StepMasks
from ..model.tree import MAX_ROW
from ..request import Request
from ..wire import BRANCH_SOURCES
from .adaptive import MIN_GAIN
from .costs import StepCosts
from .rows import VerifyRow

ALT, LOOKUP = BRANCH_SOURCES  # the sources of branch drafts (statistics): a runner-up token; another lookup match
ALT_FLOOR = 0.05  # a draft model's runner-up kept as a candidate from this probability (below: never worth a row)
LOOKUP_OTHERS = 3  # further n-gram continuations kept as candidates
CANDIDATES = {"alts": ALT_FLOOR, "others": LOOKUP_OTHERS, "": 0}  # by a drafter's declared tree material
PROBE_EVERY = 8  # after a step without a tree, the drafters keep candidates every this many steps only


def budget(tree_nodes: int, max_draft_len: int) -> int:
    """EngineConfig.tree_nodes -> branch nodes per verify row at most (auto: max_draft_len)."""
    return max_draft_len if tree_nodes < 0 else tree_nodes


def branchable(req: Request, coupled: bool, guided_ok: bool) -> bool:
    """Whether the request's row may be a tree: its verify reads the row as a tree (tree.walk), not as a line."""
    p = req.params
    plain = not p.penalized and not p.wants_logprobs and (p.greedy or coupled)
    return p.tree_drafts and plain and (req.guide is None or guided_ok)


def alt_key(q: float) -> str:
    """A runner-up's estimate key: by its drafter's probability of it (calibrated by what verifies teach)."""
    return "alt" + next((str(i) for i, edge in enumerate(ALT_BUCKETS) if q < edge), str(len(ALT_BUCKETS)))


ALT_BUCKETS = (0.1, 0.2, 0.4)  # runner-up probability buckets: [floor, 0.1), [0.1, 0.2), [0.2, 0.4), [0.4, 1]
# each estimate's prior (a verify's observations move it: Population's weight of one observation): a runner-up by
# its bucket's lower edge; a lookup branch's first node, and a node after a taken one
PRIORS = {"alt0": ALT_FLOOR, "alt1": 0.1, "alt2": 0.2, "alt3": 0.4, "branch": 0.1, "branch+": 0.5}


def candidates(prop: Proposal, others: list[list[int]], reach: list[float], rate) -> list[tuple]:
    """A row's candidate branch nodes -> (chance, parent, token, source, key), parents named by candidate index:
    -1 - i is the line's row i (0: the last committed token), j >= 0 the j-th candidate; parents come first.
    reach[i]: the line's chance to reach row i; rate(key): the engine's estimate that the target takes a node
    whose parent its path reached."""
    line = prop.tokens
    out: list[tuple] = []
    at: dict[tuple[int, int], int] = {}  # (parent, token) -> candidate index (the trie)

    def add(chance: float, parent: int, token: int, source: str, key: str) -> int:
        if (parent, token) in at:
            j = at[(parent, token)]
            out[j] = (max(out[j][0], chance), *out[j][1:])
            return j
        at[(parent, token)] = len(out)
        out.append((chance, parent, token, source, key))
        return len(out) - 1

    for i, (token, q) in sorted(prop.alts.items()):
        if i < len(line) and token != line[i]:
            add(reach[i] * rate(alt_key(q)), -1 - i, token, ALT, alt_key(q))
    for seq in others:
        j = next((j for j in range(min(len(seq), len(line))) if seq[j] != line[j]), min(len(seq), len(line)))
        chance, parent = reach[j], -1 - j
        for n, token in enumerate(seq[j:]):
            key = "branch+" if n else "branch"
            chance *= rate(key)
            parent = add(chance, parent, token, LOOKUP, key)
    return out


class TreePlanner:
    def __init__(
        self, drafters: dict, masks: StepMasks, budget: int, faults: Faults, coupled: bool, guided: bool, target
    ):
        """budget: branch nodes per row at most (0: lines only; the drafters then keep no candidates); guided:
        whether guided rows may branch (their masks must be filled before the forward); target: the ModelRunner
        that verifies (a row's tokens, branches included, are written past the request's cache_len, within its
        max_seq_len positions; keep_path moves an accepted path's K and V into place)."""
        self.masks, self.budget, self.faults, self.coupled, self.guided = masks, budget, faults, coupled, guided
        self.context, self.keep = target.max_seq_len, target.keep_path
        self.rates = Population()  # engine-wide: the share of reached branch nodes the target took, by key
        self.width = min(MAX_ROW, masks.stride)  # a row's tokens at most: the ancestor masks', the mask rows'
        self.drafters, self.idle = drafters, 0  # steps since a tree last paid
        self._keep_candidates(budget > 0)

    def _keep_candidates(self, on: bool) -> None:
        """Whether the drafters keep tree material in the next step's drafts (runner-ups cost a softmax per draft)."""
        for name, drafter in self.drafters.items():
            drafter.alternatives = CANDIDATES[registry.DRAFTERS[name].tree] if on else 0

    def plan(self, rows: list[VerifyRow], costs: StepCosts, sunk: float = 0.0) -> None:
        """Add each row's branches (row.proposal.branches), the step's rows chosen together (see the header).
        Trees that raise the step's expected tokens per second by MIN_GAIN or less are dropped whole (within the
        cost fit's error, and their untimed work: candidates, masks, the K and V moves); after a step without a
        tree the drafters keep candidates every PROBE_EVERY-th step only."""
        if self.budget <= 0 or not costs.known:
            return
        paid = self._branch(rows, costs, sunk)
        self.idle = 0 if paid else self.idle + 1
        self._keep_candidates(self.idle % PROBE_EVERY == 0)

    def _branch(self, rows: list[VerifyRow], costs: StepCosts, sunk: float) -> bool:
        """plan()'s choice -> whether the step keeps any tree."""
        pool = []  # (chance, depth, row, candidate index)
        cands: dict[int, list] = {}
        lines = [v.req.acceptance.chances(v.proposal.sources) if v.proposal.tokens else [] for v in rows]
        for b, v in enumerate(rows):
            r, p = v.req, v.proposal
            if not branchable(r, self.coupled, self.guided) or not (p.alts or p.others or v.shadow):
                continue
            others = p.others + ([v.shadow.tokens] if v.shadow else [])
            reach = [1.0, *lines[b]]
            found = self.faults.guard(r, candidates, p, others, reach, self.rate, default=[])
            cands[b] = found
            depth = {}
            for j, (chance, parent, *_) in enumerate(found):
                depth[j] = (depth[parent] if parent >= 0 else -1 - parent) + 1
                pool.append((chance, depth[j], b, j))
        if not pool:
            return False
        cost = costs.curve()
        tokens = sum(1 + sum(c) for c in lines)
        n_rows = sum(1 + len(v.proposal.tokens) for v in rows)
        seconds = cost(n_rows) + sunk
        base = tokens / seconds
        placed: dict[tuple[int, int], int] = {}  # (row, candidate) -> its row index in the verify row
        for chance, _, b, j in sorted(pool, key=lambda c: (-c[0], c[1])):
            v = rows[b]
            _, parent, token, source, key = cands[b][j]
            prow = -1 - parent if parent < 0 else placed.get((b, parent))
            width = 1 + len(v.proposal.tokens) + len(v.proposal.branches)
            room = min(self.width, self.context - v.req.cache_len)
            if prow is None or len(v.proposal.branches) >= self.budget or width >= room:
                continue
            more = cost(n_rows + 1) + sunk
            if (tokens + chance) * seconds <= tokens * more:
                break  # likeliest first: no later node pays either
            if v.req.guide is not None and not self._legal(v, prow, token, width):
                continue
            v.proposal.branches.append(Branch(prow, token, source, chance, key))
            placed[(b, j)] = width
            tokens, n_rows, seconds = tokens + chance, n_rows + 1, more
        if placed and tokens / seconds <= (1 + MIN_GAIN) * base:
            for v in rows:
                v.proposal.branches.clear()
            return False
        return bool(placed)

    def rate(self, key: str) -> float:
        return self.rates.rate(key, PRIORS[key])

    def settle(self, v: VerifyRow, start: int, path: list[int]) -> None:
        """After a tree row's verify (it started at cache position `start`; the accepted drafts' rows `path`): the
        path's K and V into place, and each branch node whose parent the path reached teaches its estimate whether
        the target took it."""
        self.keep(v.req.slot, start, path)
        reached = {0, *path}
        line = len(v.proposal.tokens)
        for n, b in enumerate(v.proposal.branches, line + 1):
            if b.parent in reached:
                self.rates.observe(b.key, int(n in reached), 1)

    def _legal(self, v: VerifyRow, parent: int, token: int, row: int) -> bool:
        """Whether the grammar accepts the path to a new node (token after row `parent`); if so its mask row is
        filled at `row`. The matcher is back at the committed tokens after."""
        drafts, parents = v.drafts, v.proposal.parents or [-1, *range(len(v.proposal.tokens))]
        path, node = [token], parent
        while node > 0:
            path.append(drafts[node - 1])
            node = parents[node]
        ok = self.faults.guard(v.req, self.masks.seal_path, v.req.slot, v.req.guide, path[::-1], row, default=False)
        return bool(ok)
