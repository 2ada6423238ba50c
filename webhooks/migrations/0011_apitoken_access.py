from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0010_config_version_at_commit")]

    operations = [
        # Tokens that exist already were made for publishing: they keep exactly that.
        migrations.AddField(
            model_name="apitoken",
            name="access",
            field=models.CharField(
                choices=[
                    ("publish", "Publish events only"),
                    ("read", "Read-only (management API)"),
                    ("write", "Read-write (management API and publishing)"),
                ],
                default="publish",
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="apitoken",
            name="access",
            field=models.CharField(
                choices=[
                    ("publish", "Publish events only"),
                    ("read", "Read-only (management API)"),
                    ("write", "Read-write (management API and publishing)"),
                ],
                default="write",
                help_text="Read-only tokens list and read; read-write tokens also change, resend, replay and publish; publish-only tokens publish events and nothing else.",
                max_length=10,
            ),
        ),
        migrations.AlterField(
            model_name="apitoken",
            name="tenant",
            field=models.ForeignKey(
                blank=True,
                help_text="Restrict the token to one tenant. Empty: an operator token, for every tenant.",
                null=True,
                on_delete=models.deletion.CASCADE,
                related_name="api_tokens",
                to="tenants.tenant",
            ),
        ),
    ]
