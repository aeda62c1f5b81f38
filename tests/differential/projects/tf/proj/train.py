"""A SageMaker-style TensorFlow script for MultiWorkerMirroredStrategy, written the way SageMaker's
and TensorFlow's multi-worker examples are: data from SM_CHANNEL_TRAINING, the strategy's cluster
from TF_CONFIG, and only the chief (worker 0) saves the model, to SM_MODEL_DIR; the other workers
save theirs to a temporary directory and remove it (every worker must take part in the save)."""

import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the script's own choice: TF's C++ chatter off

import numpy as np
import tensorflow as tf

from observe import record


def is_chief(task_type, task_id):
    return task_type == "worker" and task_id == 0


strategy = tf.distribute.MultiWorkerMirroredStrategy()
task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
data = np.load(os.path.join(os.environ["SM_CHANNEL_TRAINING"], "train.npz"))


class Linear(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.zeros((4, 1)))

    @tf.function(input_signature=[tf.TensorSpec((None, 4))])
    def __call__(self, x):
        return x @ self.w


with strategy.scope():
    model = Linear()


@tf.function
def step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grad = tf.distribute.get_replica_context().all_reduce("mean", tape.gradient(loss, model.w))
        model.w.assign_sub(0.1 * grad)
        return loss
    return strategy.reduce("mean", strategy.run(replica, args=(x, y)), axis=None)


dataset = tf.data.Dataset.from_tensor_slices((data["x"], data["y"])).batch(16)
for x, y in strategy.experimental_distribute_dataset(dataset):
    loss = step(x, y)
print(f"worker {task_type} {task_id} of {strategy.num_replicas_in_sync}: loss {float(loss):.4f}", flush=True)

if is_chief(task_type, task_id):
    target = os.environ["SM_MODEL_DIR"]
else:
    target = tempfile.mkdtemp(prefix=f"worker-{task_id}-")
tf.saved_model.save(model, os.path.join(target, "1"))
saved = sorted(os.listdir(os.path.join(target, "1")))
if is_chief(task_type, task_id):
    print(f"the chief saved the model to SM_MODEL_DIR: {saved}", flush=True)
else:
    shutil.rmtree(target)
    print(f"worker {task_type} {task_id} is not the chief: its copy of the model was removed", flush=True)
record(globals(), tag=f"{task_type}_{task_id}", model_dir=target, saved=saved,
       tf_config=os.environ.get("TF_CONFIG"))
sys.stdout.flush()
