"""SageMaker training jobs as a phalanx backend (``--backend sagemaker``).

Light on purpose: nothing here imports boto3. The pieces, each in its own module:

- ``options``  the backend's options as data, and the job file's ``sagemaker:`` section;
- ``layout``   where things are: the container's ``/opt/ml`` tree and the job's S3 prefixes (pure);
- ``images``   AWS's framework training images per framework, version, region and device (pure);
- ``request``  the CreateTrainingJob request of one attempt (pure; what ``--dry-run`` prints);
- ``schema``   a strict validator built from botocore's own service model;
- ``client``   the one door to AWS (SageMaker, S3, CloudWatch Logs through boto3, imported lazily);
- ``uploads``  the code bundle and local channels to S3, content-hashed;
- ``watch``    a training job followed from here: status, CloudWatch streams into the job directory;
- ``entry``    what each instance runs (standard library only: the image has nothing of phalanx);
- ``backend``  the thin adapter to ``backends/base.py``.
"""
