import json, math, sys
import numpy as np
import gzip
data = json.load(gzip.open(sys.argv[1]) if sys.argv[1].endswith(".gz") else open(sys.argv[1]))
def softmax(x):
    x=np.array(x); e=np.exp(x-x.max()); return e/e.sum()
rules = {}
def rule(f): rules[f.__name__]=f; return f
# scores[judge][answer] = per-token logprobs (stop included if ended)
@rule
def mean_softmax(sc, A):  # current
    return sum(softmax([np.mean(t) if t else -1e30 for t in sc[j]]) for j in range(len(sc)))
@rule
def sum_mixture(sc, A):
    return np.logaddexp.reduce([[sum(t) for t in sc[j]] for j in range(len(sc))], axis=0)
@rule
def sum_softmax(sc, A):
    return sum(softmax([sum(t) for t in sc[j]]) for j in range(len(sc)))
@rule
def min_softmax(sc, A):
    return sum(softmax([min(t) if t else -1e30 for t in sc[j]]) for j in range(len(sc)))
@rule
def cross_mean(sc, A, own_col):  # other judges only, mean logprob, relative to judge's own answer
    k=len(sc); tot=np.zeros(len(A))
    for j in range(k):
        own=np.mean(sc[j][own_col[j]])
        for c in range(len(A)):
            if c!=own_col[j]: tot[c]+= np.mean(sc[j][c]) - own
    return tot
@rule
def cross_min(sc, A, own_col):
    k=len(sc); tot=np.zeros(len(A))
    for j in range(k):
        own=min(sc[j][own_col[j]])
        for c in range(len(A)):
            if c!=own_col[j]: tot[c]+= min(sc[j][c]) - own
    return tot
@rule
def cross_sum(sc, A, own_col):
    k=len(sc); tot=np.zeros(len(A))
    for j in range(k):
        own=sum(sc[j][own_col[j]])
        for c in range(len(A)):
            if c!=own_col[j]: tot[c]+= sum(sc[j][c]) - own
    return tot
@rule
def mean_prob_mixture(sc,A):  # mean token prob averaged over judges
    return sum(np.array([np.mean(np.exp(t)) for t in sc[j]]) for j in range(len(sc)))
@rule
def geo_mean_mixture(sc,A):  # mixture of geometric-mean token probs
    return sum(np.array([np.exp(np.mean(t)) for t in sc[j]]) for j in range(len(sc)))
import itertools
K = int(sys.argv[2]) if len(sys.argv) > 2 else None  # members used: the first K
def sub(p):
    A=p['answers'][:K]; sc=[row[:K] for row in p['scores'][:K]]
    first={}
    for i,a in enumerate(A): first.setdefault(a[0], i)
    keep=sorted(set(first.values()))
    # judge j's own answer index among distinct: map
    return A, sc, keep
for name,f in rules.items():
    right=0
    for p in data:
        A, sc, keep = sub(p)
        if len(keep)==1: right+=A[0][2]; continue
        # build distinct view; own answer for cross rules = the judge's own text's distinct column
        D=[A[i] for i in keep]
        col={a[0]:c for c,a in enumerate(D)}
        S=[[sc[j][i] for i in keep] for j in range(len(sc))]
        own=[col[A[j][0]] for j in range(len(sc))]
        v=f(S, D, own) if f.__code__.co_argcount==3 else f(S, D)
        right+=D[int(np.argmax(v))][2]
    print(f"{name:20s} {right}/{len(data)}")
print("members", [sum(p['answers'][i][2] for p in data) for i in range(len(data[0]['answers'][:K]))], "ceiling", sum(any(a[2] for a in p['answers'][:K]) for p in data))

def strip_common(S):
    # per judge: drop the leading tokens all candidates share (equal values)
    out=[]
    for row in S:
        k=0
        while all(len(t)>k+1 for t in row) and max(t[k] for t in row)-min(t[k] for t in row) < 1e-3:
            k+=1
        out.append([t[k:] for t in row])
    return out
print("--- stripped common prefix")
for name in ["mean_softmax","min_softmax","sum_softmax","cross_min"]:
    f=rules[name]; right=0
    for p in data:
        A, sc, keep = sub(p)
        if len(keep)==1: right+=A[0][2]; continue
        D=[A[i] for i in keep]; col={a[0]:c for c,a in enumerate(D)}
        S=strip_common([[sc[j][i] for i in keep] for j in range(len(sc))])
        own=[col[A[j][0]] for j in range(len(sc))]
        v=f(S, D, own) if f.__code__.co_argcount==3 else f(S, D)
        right+=D[int(np.argmax(v))][2]
    print(f"{name:20s} {right}/{len(data)}")
