"""Train a small MLP on the bundled digits with CREW: p of n ranks average after each step.

export CREW_SECRET=$(openssl rand -hex 32)
torchrun --standalone --nproc-per-node 4 examples/train_digits.py --group-size 2
"""

import argparse

import torch
from torch import nn

import crew
from crew.train.datasets import Partition, load_split, shard

parser = argparse.ArgumentParser()
parser.add_argument("--group-size", type=int, default=2, help="p: ranks per averaging group")
parser.add_argument("--steps", type=int, default=60, help="local steps per rank")
parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)  # the same initial model on every rank
model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
train, test = load_split(seed=0)
with crew.Averager(model, group_size=args.group_size) as averager:
    mine = shard(train, averager.world_size, averager.rank, Partition.IID, seed=0)
    x, y = torch.from_numpy(mine.x.copy()), torch.from_numpy(mine.y.copy())
    averaged = 0
    for _ in range(args.steps):
        batch = torch.randint(len(y), (32,))
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        averaged += averager.step().averaged
    with torch.no_grad():
        logits = model(torch.from_numpy(test.x.copy()))
        accuracy = (logits.argmax(1).numpy() == test.y).mean()
    print(f"rank {averager.rank}: averaged {averaged}/{args.steps} rounds, accuracy {accuracy:.3f}")
