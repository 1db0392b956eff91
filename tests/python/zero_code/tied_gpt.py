"""A tiny GPT whose token embedding is also its LM head (tied weights)."""
import torch
import torch.nn.functional as F
from torch import nn

from _common import print_loss, print_tensors

VOCAB, DIM, CONTEXT = 2048, 256, 32


class TinyGPT(nn.Module):
    def __init__(self, layers=2, heads=4):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, heads, 4 * DIM, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, tokens):
        length = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(length))
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
generator = torch.Generator().manual_seed(1)
for step in range(6):
    tokens = torch.randint(0, VOCAB, (8, CONTEXT + 1), generator=generator)
    optimizer.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    print_loss(step, loss)
print("tied", model.head.weight is model.tokens.weight)
print_tensors(model.named_parameters())
