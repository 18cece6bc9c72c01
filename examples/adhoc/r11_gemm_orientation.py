"""A float32 product over M rows as F.linear(x, W) against torch.mm(W, x.T).T, for SmolLM2's weight shapes (out of cache:
many copies cycled), M = 2..9, in units of F.linear over one row. Round 11 on the AMD EPYC (MKL 2024.2): the transposed
product is cheaper for most shapes at M <= 5 (LM head M = 2: 0.86 against 1.91), dearer for others; routing all of
SmolLM2's linears through it in verify forwards (a TorchFunctionMode, /tmp prototype) ran EAGLE at 0.80-0.96x of
generate against 0.95-0.97x without, so it was not pursued. Usage: python examples/adhoc/r11_gemm_orientation.py"""
import time, torch, sys
torch.set_num_threads(1); torch.manual_seed(0)
shapes={'q 576x576':(576,576),'kv 192x576':(192,576),'up 1536x576':(1536,576),'down 576x1536':(576,1536),'lm 49152x576':(49152,576)}
if len(sys.argv)>1: shapes={'ref?':(int(sys.argv[1]),int(sys.argv[2]))}
def run(f, Ws, x, reps):
    n=len(Ws)
    for i in range(n): f(x,Ws[i])
    best=1e9
    for r in range(3):
        t=time.perf_counter()
        for i in range(reps): f(x,Ws[i%n])
        best=min(best,(time.perf_counter()-t)/reps)
    return best*1e6
lin=lambda x,w: torch.nn.functional.linear(x,w)
mmT=lambda x,w: torch.mm(w,x.t()).t()
for name,(N,K) in shapes.items():
    copies=max(1,int(160e6/(N*K*4)))
    Ws=[torch.randn(N,K) for _ in range(copies)]
    reps=max(copies,10)
    b1=run(lin,Ws,torch.randn(1,K),reps)
    row=[]
    for m in range(2,10):
        x=torch.randn(m,K)
        row.append(f"{m}:{run(lin,Ws,x,reps)/b1:.2f}/{run(mmT,Ws,x,reps)/b1:.2f}")
    print(f"{name:14s} M=1 {b1:.0f}us  lin/mmT:", " ".join(row), flush=True)
    del Ws
