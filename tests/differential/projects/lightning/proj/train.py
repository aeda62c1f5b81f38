"""A Lightning script whose Trainer starts its own workers (devices=2), as its docs show."""

import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from observe import record


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=2,
                        enable_progress_bar=False, enable_model_summary=False, logger=False,
                        enable_checkpointing=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    # One write: the ranks share one stdout, and with PYTHONUNBUFFERED print's text and its newline
    # are two writes that another rank's line can fall between.
    sys.stdout.write(f"rank {trainer.global_rank} of {trainer.world_size} done\n")
    record(globals(), tag=trainer.global_rank)


if __name__ == "__main__":
    main()
