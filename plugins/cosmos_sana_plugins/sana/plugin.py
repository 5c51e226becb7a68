"""Entry point of the built-in sana plugin: the SANA / SANA-Video model adapter."""

from cosmos_sana.hookspecs import hookimpl
from cosmos_sana.specs import ModelSpec


@hookimpl
def cosmos_sana_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="sana",
            target="cosmos_sana_plugins.sana.model:SanaModel",
            description="SANA and SANA-Video (diffusers pipelines) for cosmos-rl: device-agnostic, text mask in "
            "training, CHI option, PEFT LoRA adapters, samplers with log-probs",
            pipeline_classes=("SanaPipeline", "SanaVideoPipeline"),
            native_loader="cosmos_sana_plugins.sana.native_checkpoint:load_native_transformer",
            generator="cosmos_sana_plugins.sana.generate:generate",
            lora_layouts=(("comfyui", "cosmos_sana_plugins.sana.comfyui_lora:write_comfyui_lora"),),
            lora_writer="cosmos_sana_plugins.sana.export_formats:write_lora",
            native_writer="cosmos_sana_plugins.sana.export_formats:write_native",
            native_converter="cosmos_sana_plugins.sana.native_checkpoint:convert_to_pipeline",
            pipeline_check="cosmos_sana_plugins.sana.export_formats:check_components",
        )
    ]
