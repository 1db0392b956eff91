"""An actor and a critic, each with its own optimizer, trained in turns (as in RLHF)."""
import torch
import torch.nn.functional as F

from _common import batches, mlp, print_loss, print_tensors

torch.manual_seed(0)
actor = mlp(128, 1024, 32)
critic = mlp(128, 1024, 1)
actor_optimizer = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-3)
for step, (states, rewards) in enumerate(batches(1, 6, (16, 128), (16, 1))):
    if step % 2 == 0:  # the critic learns the rewards
        critic_optimizer.zero_grad()
        loss = F.mse_loss(critic(states), rewards)
        loss.backward()
        critic_optimizer.step()
    else:  # the actor follows the critic's advantage
        with torch.no_grad():
            advantage = rewards - critic(states)
        actor_optimizer.zero_grad()
        log_probs = F.log_softmax(actor(states), dim=-1)[:, 0:1]
        loss = -(log_probs * advantage).mean()
        loss.backward()
        actor_optimizer.step()
    print_loss(step, loss)
print_tensors(actor.named_parameters())
print_tensors(critic.named_parameters())
