"""rlds_reverb: RLDS datasets -> TF-Agents trajectories -> Reverb tables, fast.

The pins below are the known-good set: TensorFlow 2.15 needs protobuf 3.20,
which rules out tensorflow-metadata > 1.14 and numpy >= 2. tf-agents 0.19.0
is deliberately *not* listed: it pins typing-extensions==4.5.0 while
gymnasium 1.x needs >= 4.12, so it is installed with `--no-deps` afterwards
(see the Makefile); the combination works in practice.
"""
import setuptools

INSTALL_REQUIRES = [
    'tensorflow==2.15.1',
    'tf-keras==2.15.1',
    'dm-reverb==0.14.0',
    'tensorflow-probability==0.23.0',
    'rlds==0.1.8',
    'tensorflow-datasets==4.9.4',
    'tensorflow-metadata==1.14.0',
    'numpy<2',
    'gymnasium>=1.0,<2',
    'mujoco<3.4',
    'gymnasium-robotics',
    # tf-agents' own requirements, installed here because tf-agents itself
    # goes in with --no-deps.
    'gym==0.23.0',
    'pygame==2.1.3',
    'cloudpickle',
    'pillow',
    'dm-tree',
    'wrapt',
    'tqdm',
    'absl-py',
    'gin-config==0.5.0',  # configs/*.gin, pipelines.train --gin_file
    'matplotlib',
]

setuptools.setup(
    name='rlds_reverb',
    version='0.1.0',
    description='Fast RLDS -> TF-Agents -> Reverb conversion and training.',
    packages=setuptools.find_packages(include=['rlds_reverb', 'rlds_reverb.*', 'pipelines', 'pipelines.*']),
    package_data={'rlds_reverb': ['policies/*/*.npz', 'policies/*/*/*.npz',
                                  'policies/*/*/*.json']},
    python_requires='>=3.10,<3.12',
    install_requires=INSTALL_REQUIRES,
    extras_require={'test': ['pytest', 'pytest-xdist', 'pytest-timeout', 'hypothesis']},
)
