"""The parts of M3-Agent's ``mmagent`` package that memforest's tests run, copied from
ByteDance-Seed/m3-agent (Apache License 2.0; each copied file keeps its licence header and
says what was left out): ``videograph.VideoGraph`` (build, refresh_equivalences,
truncate_memory_by_clip, prune_memory_by_node_type, search_text_nodes),
``memory_processing.parse_video_caption``, ``memory_processing_qwen.process_memories`` and
``retrieve`` (translate, back_translate, retrieve_from_videograph, search). The model calls
are replaced by ``utils/chat_api.py``, a stand-in of our own."""
