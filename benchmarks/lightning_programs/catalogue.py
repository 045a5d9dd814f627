"""The public Lightning programs ``benchmarks/lightning_programs.py`` runs: where each one is
(repository, commit, path), what it needs (data, packages, environment), how it is run as its
authors meant (``argv``, a notebook's ``cells``) and the recipe for the harness-built settings
(``build``: Python given ``P``, the program's module, and ``L``, the framework's package; it sets
``model``, ``trainer``, ``fit`` and ``test``, see ``drive.py``). None of the programs' code is kept
here; the recipes name their classes and repeat the Trainer settings each program uses, made
short with ``limit_*_batches``.

Keys: ``name``, ``source`` (a short label), ``repository`` (owner/name), ``mirror``
(``OWNER+NAME``, the snapshot's folder under ``--mirrors``), ``commit``, ``path`` (the file run),
``tree`` (files or folders ending in ``/`` to copy, default ``[path]``), ``kind`` (``script``,
``jupytext``, ``ipynb``), ``cells`` (a notebook's cells run as the program, 0-based code cells;
default all), ``defs_cells`` (cells that make the module the recipe imports), ``venv`` (``tv``:
needs torchvision, run with ``--tv-python``), ``cwd`` (run folder, relative to the program's
root; default the file's folder), ``data`` ((kind, folder it is linked into) pairs), ``packages``,
``package`` (the Lightning package the program imports, default ``lightning.pytorch``),
``argv``, ``hydra`` (the template's own overrides for each setting), ``env``, ``timeout``,
``standins`` (run with ``standins/`` on the path: small stand-ins for torchvision's MNIST and
transforms and for ``watermark``, where this environment has neither), ``module`` (the module
the recipe imports, for a script whose own module can't be imported without running it),
``max_epochs`` (``single``: a Trainer's ``max_epochs`` above it is capped to it, for notebooks
that train for hundreds of epochs).
"""

LIGHTNING = dict(repository="Lightning-AI/pytorch-lightning",
                 mirror="Lightning-AI+pytorch-lightning",
                 commit="be98784a1a03581b7051a355ae1084fd352d7cea")  # tag 2.6.5
TUTORIALS = dict(repository="Lightning-AI/tutorials", mirror="Lightning-AI+tutorials",
                 commit="15817658a2d63afa338b9e1cd8454fb98d746fac")
UVADLC = dict(repository="phlippe/uvadlc_notebooks", mirror="phlippe+uvadlc_notebooks",
              commit="0da8037c7abc32f478ff6142acceb72dbcf088ee")
HYDRA = dict(repository="ashleve/lightning-hydra-template",
             mirror="ashleve+lightning-hydra-template",
             commit="bddbc24b82ab6ccfa6243e815a49dc5bfe8d4144")
DLF = dict(repository="Lightning-AI/dl-fundamentals", mirror="Lightning-AI+dl-fundamentals",
           commit="3074b8c8e993d5a5d7bfc55424d3feef191841c5")
LMP = dict(repository="SatvikPraveen/LightningMasterPro", mirror="SatvikPraveen+LightningMasterPro",
           commit="50f7c0ebf3181a34cac166f7bd02c710145fe47b")
WANDB = dict(repository="wandb/examples", mirror="wandb+examples",
             commit="5cab88702fc51edfb4afc79a1de89e9acf6cb605")

#: the harness-built runs: two short epochs
SHORT = "limit_train_batches=20, limit_val_batches=5, limit_test_batches=5, max_epochs=2"

PROGRAMS = [
    dict(LIGHTNING, name="pl-bug-report", source="Lightning examples",
         path="examples/pytorch/bug_report/bug_report_model.py", packages=[],
         build="""
from torch.utils.data import DataLoader
model = P.BoringModel()
trainer = dict(limit_train_batches=1, limit_val_batches=1, limit_test_batches=1,
               num_sanity_val_steps=0, max_epochs=2, enable_model_summary=False)
fit = dict(train_dataloaders=DataLoader(P.RandomDataset(32, 64), batch_size=2),
           val_dataloaders=DataLoader(P.RandomDataset(32, 64), batch_size=2))
test = dict(dataloaders=DataLoader(P.RandomDataset(32, 64), batch_size=2))
"""),
    dict(LIGHTNING, name="pl-autoencoder", source="Lightning examples",
         path="examples/pytorch/basics/autoencoder.py", venv="tv",
         packages=["torchvision", "jsonargparse[signatures]"],
         data=[("mnist", "examples/Datasets"), ("mnist", "examples/pytorch/basics/data")],
         argv=["--trainer.max_epochs=2", "--trainer.limit_train_batches=100",
               "--trainer.limit_val_batches=20", "--trainer.limit_test_batches=20",
               "--trainer.limit_predict_batches=2"],
         build=f"""
model = P.LitAutoEncoder()
dm = P.MyDataModule(batch_size=32)
trainer = dict(callbacks=P.ImageSampler(), {SHORT})
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(LIGHTNING, name="pl-backbone-classifier", source="Lightning examples",
         path="examples/pytorch/basics/backbone_image_classifier.py", venv="tv",
         packages=["torchvision", "jsonargparse[signatures]"],
         data=[("mnist", "examples/Datasets"), ("mnist", "examples/pytorch/basics/data")],
         argv=["--trainer.max_epochs=2", "--trainer.limit_train_batches=100",
               "--trainer.limit_val_batches=20", "--trainer.limit_test_batches=20",
               "--trainer.limit_predict_batches=2"],
         build=f"""
model = P.LitClassifier()
dm = P.MyDataModule(batch_size=32)
trainer = dict({SHORT})
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(LIGHTNING, name="pl-transformer", source="Lightning examples",
         path="examples/pytorch/basics/transformer.py", packages=[],
         data=[("wikitext2", "examples/pytorch/basics/data")],
         build=f"""
from torch.utils.data import DataLoader, random_split
L.seed_everything(42)
dataset = P.WikiText2()
n = len(dataset)
train, val, test_ = random_split(dataset, [n - 4000, 2000, 2000])
model = P.LanguageModel(vocab_size=dataset.vocab_size)
trainer = dict(gradient_clip_val=0.25, {SHORT})
fit = dict(train_dataloaders=DataLoader(train, batch_size=20, shuffle=True),
           val_dataloaders=DataLoader(val, batch_size=20))
test = dict(dataloaders=DataLoader(test_, batch_size=20))
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-mnist-hello-world", source="Lightning tutorials",
         path="lightning_examples/mnist-hello-world/hello-world.py", kind="jupytext",
         venv="tv", packages=["torchvision", "torchmetrics", "pandas", "seaborn", "ipython"],
         data=[("mnist", "lightning_examples/mnist-hello-world")], defs_cells=[0, 1, 3],
         build=f"""
model = P.LitMNIST()
trainer = dict(accelerator="cpu", devices=1, {SHORT},
               logger=M("loggers").CSVLogger(save_dir=P.config.save_dir))
fit = dict()
test = dict()
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-basic-gan", source="Lightning tutorials",
         path="lightning_examples/basic-gan/gan.py", kind="jupytext", venv="tv",
         packages=["torchvision", "tensorboard"],
         data=[("mnist", "lightning_examples/basic-gan")], defs_cells=[0, 1, 2, 3, 4],
         build=f"""
dm = P.MNISTDataModule()
model = P.GAN(*dm.dims)
trainer = dict(accelerator="cpu", devices=1, {SHORT})
fit = dict(datamodule=dm)
test = None
# each optimizer's step leaves the other network's parameters without gradients: Lightning's
# plain ddp stops on them
ddp_strategy = "ddp_find_unused_parameters_true"
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-datamodules", source="Lightning tutorials",
         path="lightning_examples/datamodules/datamodules.py", kind="jupytext", venv="tv",
         packages=["torchvision", "torchmetrics"],
         data=[("mnist", "lightning_examples/datamodules"),
               ("cifar10", "lightning_examples/datamodules")],
         defs_cells=[0, 1, 3, 4, 6],
         build=f"""
dm = P.CIFAR10DataModule()
model = P.LitModel(*dm.dims, dm.num_classes, hidden_size=256)
trainer = dict(accelerator="cpu", devices=1, {SHORT})
fit = dict(datamodule=dm)
test = None  # LitModel has no test_step
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-cifar10-baseline", source="Lightning tutorials",
         path="lightning_examples/cifar10-baseline/baseline.py", kind="jupytext", venv="tv",
         packages=["torchvision", "torchmetrics", "pandas", "seaborn", "ipython"],
         data=[("cifar10-small", "lightning_examples/cifar10-baseline")],
         defs_cells=[1, 2, 3, 4],
         build=f"""
model = P.LitResnet(lr=0.05)
trainer = dict(accelerator="cpu", devices=1, {SHORT},
               logger=M("loggers").CSVLogger(save_dir="logs/"),
               callbacks=[M("callbacks").LearningRateMonitor(logging_interval="step")])
fit = dict(train_dataloaders=P.train_dataloader, val_dataloaders=P.val_dataloader)
test = dict(dataloaders=P.test_dataloader)
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-augmentation-kornia", source="Lightning tutorials",
         path="lightning_examples/augmentation_kornia/augmentation.py", kind="jupytext",
         venv="tv", packages=["torchvision", "kornia", "torchmetrics", "pandas", "seaborn",
                              "matplotlib", "ipython"],
         data=[("cifar10-small", "lightning_examples/augmentation_kornia")],
         defs_cells=[0, 1, 2, 3],
         build=f"""
model = P.CoolSystem()
trainer = dict(accelerator="cpu", devices=1, {SHORT},
               logger=M("loggers").CSVLogger(save_dir="logs/"))
fit = dict()
test = None
"""),
    dict(UVADLC, package="pytorch_lightning", name="uva-transformers-reverse", source="UvA DL course",
         path="docs/tutorial_notebooks/tutorial6/Transformers_and_MHAttention.ipynb",
         kind="ipynb", venv="tv", cells=list(range(25)), defs_cells=list(range(19)),
         packages=["torchvision", "matplotlib", "seaborn", "ipython", "tqdm"],
         env={},
         build=f"""
model = P.ReversePredictor(max_iters=2 * 40, input_dim=10, model_dim=32, num_heads=1,
                           num_classes=10, num_layers=1, dropout=0.0, lr=5e-4, warmup=50)
trainer = dict(default_root_dir="reverse", gradient_clip_val=5, {SHORT},
               callbacks=[M("callbacks").ModelCheckpoint(save_weights_only=True, mode="max",
                                                      monitor="val_acc")])
fit = dict(train_dataloaders=P.train_loader, val_dataloaders=P.val_loader)
test = dict(dataloaders=P.test_loader, verbose=False)
"""),
    dict(TUTORIALS, package="pytorch_lightning", name="tut-barlow-twins", source="Lightning tutorials",
         path="lightning_examples/barlow-twins/barlow_twins.py", kind="jupytext", venv="tv",
         packages=["torchvision", "torchmetrics", "matplotlib"],
         data=[("cifar10", "lightning_examples/barlow-twins")],
         defs_cells=[0, 1, 2, 4, 5, 6, 7, 8, 9, 10],
         # the notebook leaves its fit commented out: the recipe runs it, with the notebook's
         # model, callbacks (an online fine-tuner that adds a layer in on_fit_start and steps
         # its own optimizer in on_train_batch_end) and loaders
         build=f"""
model = P.model
trainer = dict(accelerator="auto", devices=1, {SHORT},
               callbacks=[P.OnlineFineTuner(encoder_output_dim=P.encoder_out_dim, num_classes=10),
                          M("callbacks").ModelCheckpoint(every_n_epochs=100, save_top_k=-1,
                                                         save_last=True)])
fit = dict(train_dataloaders=P.train_loader, val_dataloaders=P.val_loader)
test = None
"""),
    dict(UVADLC, package="pytorch_lightning", name="uva-vision-transformer", source="UvA DL course",
         path="docs/tutorial_notebooks/tutorial15/Vision_Transformer.ipynb",
         kind="ipynb", venv="tv", cells=list(range(10)), defs_cells=[0, 1, 2, 3, 5, 6, 7],
         packages=["torchvision", "matplotlib", "seaborn", "ipython", "tqdm"],
         data=[("cifar10", "docs/tutorial_notebooks/data")], max_epochs=2,
         # the recipe's ViT is smaller than the notebook's (6 layers of 256): 40 steps of the
         # notebook's take minutes on two cores, for each of ten runs
         build=f"""
L.seed_everything(42)
model = P.ViT(model_kwargs=dict(embed_dim=64, hidden_dim=128, num_heads=4, num_layers=2,
                                patch_size=4, num_channels=3, num_patches=64, num_classes=10,
                                dropout=0.2), lr=3e-4)
trainer = dict(default_root_dir="vit", {SHORT},
               callbacks=[M("callbacks").ModelCheckpoint(save_weights_only=True, mode="max",
                                                      monitor="val_acc"),
                          M("callbacks").LearningRateMonitor("epoch")])
fit = dict(train_dataloaders=P.train_loader, val_dataloaders=P.val_loader)
test = dict(dataloaders=P.test_loader, verbose=False)
"""),
    dict(UVADLC, package="pytorch_lightning", name="uva-energy-models", source="UvA DL course",
         path="docs/tutorial_notebooks/tutorial8/Deep_Energy_Models.ipynb",
         # cells 0-10 train; cell 14 on passes range= to torchvision's make_grid (gone)
         kind="ipynb", venv="tv", cells=list(range(11)), defs_cells=list(range(9)),
         packages=["torchvision", "matplotlib", "seaborn", "ipython"],
         data=[("mnist", "docs/tutorial_notebooks/data")], max_epochs=2,
         # its three callbacks define only on_epoch_end, which Lightning 2 never calls (and
         # ptrain.lightning warns about); the training step samples by gradient steps on its
         # inputs, with the parameters' requires_grad off and grad mode forced on
         build=f"""
L.seed_everything(42)
model = P.DeepEnergyModel(img_shape=(1, 28, 28), batch_size=P.train_loader.batch_size,
                          lr=1e-4, beta1=0.0)
trainer = dict(gradient_clip_val=0.1, {SHORT},
               callbacks=[M("callbacks").ModelCheckpoint(save_weights_only=True, mode="min",
                                                      monitor="val_contrastive_divergence"),
                          P.GenerateCallback(every_n_epochs=5),
                          P.SamplerCallback(every_n_epochs=5), P.OutlierCallback(),
                          M("callbacks").LearningRateMonitor("epoch")])
fit = dict(train_dataloaders=P.train_loader, val_dataloaders=P.test_loader)
test = None
"""),
    dict(HYDRA, name="hydra-template", source="lightning-hydra-template",
         path="src/train.py", tree=["src/", "configs/", ".project-root"], cwd=".", venv="tv",
         packages=["torchvision", "hydra-core==1.3.2", "hydra-colorlog", "rootutils", "rich",
                   "torchmetrics"],
         data=[("mnist", "data")],
         # test=False: the template's test(ckpt_path="best") fails under Lightning 2.6.6 with
         # torch 2.14 (its checkpoint's hyperparameters hold an nn.Module: weights_only load)
         argv=["seed=12345", "test=False", "trainer.max_epochs=2", "+trainer.limit_train_batches=100",
               "+trainer.limit_val_batches=20", "+trainer.limit_test_batches=20"],
         hydra={"single": [], "ddp": ["trainer=ddp_sim"],
                "bf16": ["+trainer.precision=bf16-mixed"], "unbroken": [],
                "resume1": ["trainer.max_epochs=1", "test=False"],
                "resume2": []}),
    dict(WANDB, name="wandb-image-classification", source="W&B examples",
         path="colabs/pytorch-lightning/Image_Classification_using_PyTorch_Lightning.ipynb",
         kind="ipynb", venv="tv", defs_cells=[1, 3, 4, 5, 6],
         packages=["torchvision", "wandb", "torchmetrics"],
         data=[("cifar10", "colabs/pytorch-lightning")],
         build=f"""
model = P.LitModel((3, 32, 32), P.dm.num_classes)
trainer = dict({SHORT},
               logger=M("loggers").WandbLogger(project="wandb-lightning", job_type="train"),
               callbacks=[M("callbacks").EarlyStopping(monitor="val_loss"),
                          P.ImagePredictionLogger(P.val_samples),
                          M("callbacks").ModelCheckpoint()])
fit = dict(datamodule=P.dm)
test = dict(dataloaders=P.dm.test_dataloader())
"""),
    dict(DLF, name="dlf-regression", source="dl-fundamentals",
         path="unit05-lightning/exercises/solutions/1_lightning-regression/training.py",
         tree=["unit05-lightning/exercises/solutions/1_lightning-regression/training.py",
               "unit05-lightning/exercises/solutions/1_lightning-regression/shared_utilities.py"],
         standins=True, packages=["torchmetrics", "pandas", "scikit-learn", "matplotlib"],
         data=[("ames", "unit05-lightning/exercises/solutions/1_lightning-regression")],
         # training.py plots its CSV log at import, outside its __main__ block
         module="shared_utilities",
         build=f"""
import torch
torch.manual_seed(123)
dm = P.AmesHousingDataModule()
model = P.LightningModel(model=P.PyTorchMLP(num_features=3), learning_rate=0.001)
trainer = dict(accelerator="cpu", devices=1, deterministic=True, {SHORT},
               logger=M("loggers").CSVLogger(save_dir="logs/", name="my-model"))
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(DLF, name="dlf-custom-callback", source="dl-fundamentals",
         path="unit05-lightning/exercises/solutions/2_custom-callback/training.py",
         tree=["unit05-lightning/exercises/solutions/2_custom-callback/training.py",
               "unit05-lightning/exercises/solutions/2_custom-callback/shared_utilities.py"],
         standins=True, packages=["torchmetrics", "pandas", "scikit-learn"],
         data=[("mnist", "unit05-lightning/exercises/solutions/2_custom-callback/mnist")],
         build=f"""
import torch
torch.manual_seed(123)
dm = P.MNISTDataModule()
model = P.LightningModel(model=P.PyTorchMLP(num_features=784, num_classes=10),
                         learning_rate=0.05)
trainer = dict(accelerator="cpu", devices=1, deterministic=True, {SHORT},
               logger=M("loggers").CSVLogger(save_dir="logs/", name="my-model"),
               callbacks=[P.CustomCallback()])
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(DLF, name="dlf-cli-hpo", source="dl-fundamentals",
         path="unit06-dl-tips/6.5-hparam-opt/6.5-part4-lightning-hpo/mlp_cli2.py",
         tree=["unit06-dl-tips/6.5-hparam-opt/6.5-part4-lightning-hpo/mlp_cli2.py",
               "unit06-dl-tips/6.5-hparam-opt/6.5-part4-lightning-hpo/shared_utilities.py"],
         standins=True, packages=["jsonargparse[signatures]", "torchmetrics", "scikit-learn"],
         # part 3's README command line, two epochs (part 3's own mlp_cli2.py passes
         # save_config_overwrite=, gone since Lightning 2.0: a TypeError under both; part 4's
         # is the same program with save_config_kwargs)
         argv=["--model.learning_rate", "0.1", "--model.hidden_units", "[100, 200]",
               "--trainer.max_epochs", "2"],
         build=f"""
model = P.LightningModel2(hidden_units=[100, 200], learning_rate=0.1)
dm = P.CustomDataModule()
trainer = dict(callbacks=[M("callbacks").ModelCheckpoint(monitor="val_acc")], {SHORT})
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(DLF, name="dlf-cnn-mnist", source="dl-fundamentals",
         path="unit07-computer-vision/7.4-cnn-training/7.4-part-2-cnn.ipynb",
         tree=["unit07-computer-vision/7.4-cnn-training/7.4-part-2-cnn.ipynb",
               "unit07-computer-vision/7.4-cnn-training/shared_utilities.py"],
         # cell 3 shows a grid of images with torchvision.utils.make_grid (not in the
         # stand-in); cell 0 is IPython magics
         kind="ipynb", cells=[1, 2, 4, 5, 6, 7, 8, 9], defs_cells=[1, 4, 5], max_epochs=3,
         standins=True, packages=["torchmetrics", "pandas", "matplotlib"],
         data=[("mnist", "unit07-computer-vision/7.4-cnn-training")],
         build=f"""
L.seed_everything(123)
dm = P.MnistDataModule()
model = P.LightningModel(model=P.PyTorchCNN(num_classes=10), learning_rate=0.1)
trainer = dict(accelerator="cpu", devices="auto", deterministic=True, {SHORT},
               logger=M("loggers").CSVLogger(save_dir="logs/", name="my-model"))
fit = dict(datamodule=dm)
test = dict(datamodule=dm)
"""),
    dict(LMP, package="pytorch_lightning", name="lmp-custom-callbacks",
         source="LightningMasterPro", kind="ipynb",
         path="notebooks/03_callbacks_and_checkpointing/07_custom_callbacks_swa_ema.ipynb",
         # cells 0-1: the fit with the notebook's monitor and SWA callbacks, then
         # trainer.test on a module without test_step, an error under both (after the fit's
         # metrics are recorded); cell 2 on index trainer.val_dataloaders (one DataLoader
         # since Lightning 2.0), another error under both. The monitor reads p.grad in
         # on_train_batch_end, where ptrain has already set the gradients to None
         # (docs/from-lightning.md, "Hook methods"): it prints a mean norm of 0
         cells=[0, 1], packages=["torchmetrics", "numpy"]),
]
