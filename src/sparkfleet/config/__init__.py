"""What the user wrote, validated: recipes, cluster inventories, templates, sizes, secrets, caches.

Pure: reading a file and validating it; nothing here reaches a node or plans a deployment.
"""
